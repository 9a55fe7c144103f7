#!/usr/bin/env bash
# Try vLLM 0.32's ExampleConnector (a disk-backed KV store, the one shipped connector with no RDMA,
# UCX or LMCache dependency) on CPU: one kv_both instance. Send the same ~1300-token prompt twice;
# the first saves its KV, the second should load it. Findings: docs/testbed-vllm.md.
#   scripts/try_kv_connector.sh > serve.log 2>&1 &   (stops by itself after 400 s)
V=${MIXDIAG_VLLM_VENV:-$(cd "$(dirname "$0")/.." && pwd)/.venv-vllm}
rm -rf /tmp/kvs; mkdir -p /tmp/kvs
export VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=1 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
export PATH=$V/bin:$PATH VIRTUAL_ENV=$V
exec timeout 400 $V/bin/vllm serve $V/models/tiny-llama --host 127.0.0.1 --port 18777 --served-model-name tiny-llama \
  --enforce-eager --dtype bfloat16 --max-model-len 4096 --max-num-batched-tokens 512 --max-num-seqs 16 --no-enable-prefix-caching --seed 0 \
  --kv-transfer-config '{"kv_connector":"ExampleConnector","kv_role":"kv_both","kv_connector_extra_config":{"shared_storage_path":"/tmp/kvs"}}'
