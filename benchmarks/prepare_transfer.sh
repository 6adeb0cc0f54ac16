#!/usr/bin/env bash
# Run on the CPU machine before a GPU session that trains the default drafter (issue: drafter training):
# splits the embedded 0.5B target into 55 MB chunks and writes a 4,000-conversation ShareGPT subset, both under
# the git-ignored .chunks/ (the device tool carries at most 64 MiB a call). Then, on the device, one call per
# chunk, chained within seconds (the machine idles out 30 s after a call):
#   run(carry=[".chunks/q05.aa"], command="cat .chunks/q05.aa >> /root/q05.gguf")   ... q05.ah
#   run(carry=[".chunks/q05.ai", ".chunks/sharegpt4k.json", ".chunks/q05.sha256", ".whl"],
#       command="cat .chunks/q05.ai >> /root/q05.gguf && <install wheels> && bash benchmarks/gpu_pending.sh part4")
set -euo pipefail
mkdir -p .chunks
MODEL=$(python -c 'from dflash24.default_model import default_model_path; print(default_model_path())')
rm -f .chunks/q05.*
split -b 55M "$MODEL" .chunks/q05.
sha256sum "$MODEL" | cut -d' ' -f1 > .chunks/q05.sha256
python - <<'PY'
import itertools, json
from dflash24.train.data import iter_json_array, sharegpt_path
convs = list(itertools.islice(iter_json_array(sharegpt_path().read_text(encoding="utf-8")), 4000))
json.dump(convs, open(".chunks/sharegpt4k.json", "w"))
PY
ls -la .chunks
