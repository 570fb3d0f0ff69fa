"""The bundled EAGLE head (specdec_lab/bundled/eagle, `python -m specdec_lab.training.eagle`), in the main environment.

vLLM's side (the head loads in EagleLlamaForCausalLM, drafts, is accepted, greedy equals greedy) is in
tests/test_audit_vllm.py; here: the files match the manifest, the head reads back from vLLM's names, and
on a passage of the corpus it agrees with the target far better than its untrained start.
"""

import torch
import torch.nn.functional as F

from specdec_lab.training.eagle import EAGLE_SUBDIR, EagleHead, draft_step, load_head
from specdec_lab.models import BUNDLED_DIR, verify_manifest

# Romeo and Juliet, Act II, Scene II (public domain; in the training corpus, as every prompt here is).
TEXT = ("JULIET.\nO Romeo, Romeo, wherefore art thou Romeo?\nDeny thy father and refuse thy name.\n"
        "Or if thou wilt not, be but sworn my love,\nAnd I'll no longer be a Capulet.\n")


def step1_overlap(pair, head: EagleHead) -> float:
    """Mean Σ min(p_{t+1}, q_t) over the positions of TEXT (teacher-forced step 1, T = 1)."""
    window = pair.encode(TEXT)[None]  # (1, T+1)
    with torch.no_grad():
        g, _, log_p = draft_step(pair.target, head, window)
        q = F.softmax(pair.target.lm_head(g).float(), -1)  # (1, T, V)
    return float(torch.minimum(q, log_p[:, 1:].exp()).sum(-1).mean())


def test_head_is_in_the_manifest_and_trained(pair):
    info = verify_manifest(BUNDLED_DIR)[EAGLE_SUBDIR]  # also checks the head's sha256s
    assert info["held_out_step1"]["acceptance_T1"] > info["held_out_step1_untrained"]["acceptance_T1"] + 0.1
    head = load_head(BUNDLED_DIR / EAGLE_SUBDIR, pair.target.config)
    assert sum(t.numel() for t in head.vllm_state_dict().values()) == info["parameters"]
    with torch.random.fork_rng():
        torch.manual_seed(0)
        untrained = EagleHead(pair.target.config).eval()
    trained, start = step1_overlap(pair, head), step1_overlap(pair, untrained)
    assert trained > start + 0.1, (trained, start)
