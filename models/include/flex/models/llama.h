#pragma once
// Llama (Transformers' LlamaForCausalLM, eager attention) is the plain member
// of the Llama family (decoder.h): RMSNorm in float32, SwiGLU MLP,
// grouped-query attention, RoPE computed once by model.rotary_emb (rope_scaling
// default / linear / dynamic / llama3), lm_head tied or not. The per-layer
// self_attn.rotary_emb exists (with its inv_freq) but is never called, as in
// 4.47. These names are the family's classes under Llama's name.
#include <flex/models/decoder.h>

namespace flex {

using LlamaAttention = DecoderAttention;
using LlamaMLP = DecoderMLP;
using LlamaDecoderLayer = DecoderLayer;
using LlamaModel = DecoderModel;
using LlamaForCausalLM = DecoderForCausalLM;

}  // namespace flex
