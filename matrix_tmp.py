"""Rows of the OpenVINO audit: every method x setting, m = 5,000, L = 3, seed 0."""
import json, sys, time
from pathlib import Path
from specdec_lab.adapters import openvino as ov
from specdec_lab.audit import audit, DEFAULT_PROMPT, LOOKUP_PROMPT
from specdec_lab.models import load_pair
from specdec_lab.sampling import SamplingConfig
from specdec_lab.suite import SuiteSettings
pair = load_pair("bundled")
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
m = int(sys.argv[2])
SETTINGS = {"T=1": SamplingConfig(), "T=0.7": SamplingConfig(temperature=0.7),
            "top-p 0.9": SamplingConfig(top_p=0.9), "top-k 20": SamplingConfig(top_k=20)}
CASES = [("llm", "none", None), ("llm", "draft_model", None), ("llm", "draft_model", False),
         ("llm", "prompt_lookup", None), ("continuous-batching", "none", None),
         ("continuous-batching", "draft_model", None), ("continuous-batching", "prompt_lookup", None)]
only = sys.argv[3:] 
rows = []
for pipeline, method, cache in CASES:
    for label, sampling in SETTINGS.items():
        if only and f"{pipeline}/{method}/{cache}" not in only: continue
        name = f"{pipeline}-{method}-{cache}-{label}".replace(" ", "")
        prompt = LOOKUP_PROMPT if method == "prompt_lookup" else DEFAULT_PROMPT
        config = ov.OpenvinoConfig(method=method, pipeline=pipeline, sampling=sampling, prefix_caching=cache,
                                   progress=False)
        try:
            r = audit(pair, config, m, 3, out / f"{name}.parquet", prompt=prompt, settings=SuiteSettings(),
                      progress=False)
            row = r.summary()
        except Exception as exc:
            row = {"implementation": f"{pipeline} {method} {cache}", "settings": label, "crash": f"{type(exc).__name__}: {exc}"[:300]}
        row["case"] = name
        rows.append(row)
        print(json.dumps({k: row.get(k) for k in ("case", "m", "TV upper 99%", "TV upper 99% (token 1)", "drafted share", "acceptance", "Holm p", "samples/s", "engine errors", "verdict", "crash")}, default=str), flush=True)
        ov.close_workers()
    for greedy_method in ([method] if label else []):
        pass
(out / "rows.json").write_text(json.dumps(rows, default=str, indent=1))
