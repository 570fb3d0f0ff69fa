"""Rows of the ONNX Runtime GenAI audit: every method x setting, L = 2, seed 0."""
import json, sys
from pathlib import Path
from specdec_lab.adapters import ortgenai as og
from specdec_lab.audit import audit, DEFAULT_PROMPT, LOOKUP_PROMPT
from specdec_lab.models import load_pair
from specdec_lab.sampling import SamplingConfig
from specdec_lab.suite import SuiteSettings
pair = load_pair("bundled")
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True); m = int(sys.argv[2])
SETTINGS = {"T=1": SamplingConfig(), "T=0.7": SamplingConfig(temperature=0.7),
            "top-p 0.9": SamplingConfig(top_p=0.9), "top-k 20": SamplingConfig(top_k=20)}
methods = sys.argv[3].split(",") if len(sys.argv) > 3 else ["none", "draft_model", "ngram"]
settings = sys.argv[4].split(",") if len(sys.argv) > 4 else list(SETTINGS)
for method in methods:
    for label in settings:
        sampling = SETTINGS[label]
        name = f"ort-{method}-{label}".replace(" ", "")
        prompt = LOOKUP_PROMPT if method == "ngram" else DEFAULT_PROMPT
        try:
            row = audit(pair, og.OrtGenaiConfig(method=method, sampling=sampling, progress=False), m, 2,
                        out / f"{name}.parquet", prompt=prompt, progress=False).summary()
        except Exception as exc:
            row = {"crash": f"{type(exc).__name__}: {exc}"[:300]}
        row["case"] = name
        print(json.dumps({k: row.get(k) for k in ("case", "m", "TV upper 99%", "TV upper 99% (token 1)", "drafted share", "acceptance", "Holm p", "samples/s", "engine errors", "engine messages", "verdict", "crash")}, default=str), flush=True)
        og.close_workers()
