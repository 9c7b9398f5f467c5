"""vllm#49397: Qwen3-VL / Qwen3-Omni crash at startup with image and video off.

Symptom: the engine dies in its profiling run with ``RuntimeError: Tensor on
device meta is not on the expected device cuda:0!`` (vllm#49384) when
``--limit-mm-per-prompt`` sets image and video to 0

(The recogniser and rewrite follow; this module is being written.)
"""
