"""Compact view of tune_dot.py's JSON lines: per (type, shape, M) the GEMV, the default and the best three configs.

    python benchmarks/summarize_tune.py FILE.jsonl [...]
"""
import json
import sys

for path in sys.argv[1:]:
    for line in open(path):
        d = json.loads(line)
        if "best" in d:
            print(d["type"], f'{d["N"]}x{d["K"]}', "M", d["M"], "gemv", d["gemv_us"], "default", d["default_us"])
            for b in d["best"][:3]:
                print("   ", b["us"], {k: v for k, v in b["cfg"].items() if k not in ("G", "num_stages")})
        else:
            print(json.dumps(d))
