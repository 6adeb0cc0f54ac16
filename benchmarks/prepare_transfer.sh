#!/usr/bin/env bash
# Run on the CPU machine before a GPU session that needs a real model there (the device tool carries at most
# 64 MiB a call). `prepare_transfer.sh` (default: the embedded 0.5B, q05) or `prepare_transfer.sh q15` (the 1.5B):
# splits the GGUF into 55 MB chunks under the git-ignored .chunks/, with its sha256; for q05 also a
# 4,000-conversation ShareGPT subset for drafter training. Then, on the device, one call per chunk, chained
# within seconds (the machine idles out 30 s after a call):
#   run(carry=[".chunks/q05.aa"], command="cat .chunks/q05.aa >> /root/q05.gguf")   ... q05.ah
#   run(carry=[".chunks/q05.ai", ".chunks/sharegpt4k.json", ".chunks/q05.sha256", ".whl"],
#       command="cat .chunks/q05.ai >> /root/q05.gguf && <install wheels> && bash benchmarks/gpu_pending.sh part4")
# (q15: the same with .chunks/q15.* into /root/q15.gguf, then e.g.
#  DFLASH24_TEST_GGUF=/root/q15.gguf python3 -m pytest -m gpu -s tests/test_real_model_gpu.py and
#  python3 -m dflash24.cli bench --model /root/q15.gguf --spec ar)
set -euo pipefail
NAME=${1:-q05}
case "$NAME" in
q05) MODEL=$(python -c 'from dflash24.default_model import default_model_path; print(default_model_path())') ;;
q15) MODEL=$(python -c 'from dflash24.default_model import qwen25_15b_path; p = qwen25_15b_path(); print(p or "")') ;;
*) echo "usage: $0 [q05|q15]" >&2; exit 2 ;;
esac
[ -n "$MODEL" ] && [ -f "$MODEL" ] || { echo "$NAME: model file not installed (see MODELS.md)" >&2; exit 3; }
mkdir -p .chunks
rm -f .chunks/"$NAME".*
split -b 55M "$MODEL" .chunks/"$NAME".
sha256sum "$MODEL" | cut -d' ' -f1 > .chunks/"$NAME".sha256
if [ "$NAME" = q05 ]; then
python - <<'PY'
import itertools, json
from dflash24.train.data import iter_json_array, sharegpt_path
convs = list(itertools.islice(iter_json_array(sharegpt_path().read_text(encoding="utf-8")), 4000))
json.dump(convs, open(".chunks/sharegpt4k.json", "w"))
PY
fi
ls -la .chunks
