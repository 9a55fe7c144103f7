"""A small recorded workload for the `mixdiag tune` tests: chat decodes plus long prompts chunked in."""

SCENARIO = """
name = "tune-small"
seed = 5
max_steps = 400
[model]
preset = "tiny"
num_layers = 2
hidden_size = 64
intermediate_size = 128
moe_intermediate_size = 64
[engine]
num_threads = 1
[scheduler]
policy = "{policy}"
max_num_batched_tokens = 128
chunked_prefill_size = 128
[[workload.groups]]
name = "chat"
count = 6
prompt_len = {{ dist = "uniform", low = 16, high = 48 }}
output_len = {{ dist = "uniform", low = 20, high = 30 }}
[[workload.groups]]
name = "long"
count = 3
arrival = "fixed"
start = 4
interval = 9
prompt_len = {{ dist = "uniform", low = 300, high = 500 }}
output_len = {{ dist = "fixed", value = 4 }}
"""
