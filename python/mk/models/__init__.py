"""mk.models: Llama-3 / Qwen3 decoder configs, weights, the decode and prefill nn programs and
references."""

from mk.models.build import decode_program, prefill_program
from mk.models.config import PRESETS, ModelConfig, RopeScaling, preset
from mk.models.prefill import prefill_rows
from mk.models.reference import Generation, NumpyDecoder, compare, reference_generate
from mk.models.weights import (
    WeightsError,
    check_weights,
    generated_tokens,
    load_safetensors,
    prefill_inputs,
    program_inputs,
    random_prompt,
    random_weights,
    rope_tables,
)

__all__ = [
    "PRESETS",
    "Generation",
    "ModelConfig",
    "NumpyDecoder",
    "RopeScaling",
    "WeightsError",
    "check_weights",
    "compare",
    "decode_program",
    "generated_tokens",
    "load_safetensors",
    "prefill_inputs",
    "prefill_program",
    "prefill_rows",
    "preset",
    "program_inputs",
    "random_prompt",
    "random_weights",
    "reference_generate",
    "rope_tables",
]
