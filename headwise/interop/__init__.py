"""Interop with HuggingFace: load GPT-2, BERT and Llama-family checkpoints offline (from a
directory or a model id in the local HF cache), convert them, export headwise models
back to HF, and exchange LoRA adapters with PEFT."""

from headwise.interop.bert import BertPooler
from headwise.interop.hf_export import export_hf
from headwise.interop.hub_cache import hub_cache_dir, resolve_model, snapshot_dir
from headwise.interop.load import (
    convert,
    convert_state_dict,
    hf_converter,
    load_converted,
    load_hf,
    load_pooler,
)
from headwise.interop.peft_export import export_peft, import_peft
from headwise.interop.registry import (
    CONVERTERS,
    Converter,
    Rule,
    get_converter,
    supported_model_types,
)
from headwise.interop.tokenizer import encode_batch, load_model_tokenizer, load_tokenizer

__all__ = ["CONVERTERS", "BertPooler", "Converter", "Rule", "convert",
           "convert_state_dict", "encode_batch", "export_peft", "get_converter", "hf_converter",
           "import_peft", "load_converted", "load_hf", "load_model_tokenizer", "load_pooler",
           "load_tokenizer",
           "supported_model_types", "export_hf", "hub_cache_dir", "resolve_model",
           "snapshot_dir"]
