// Package hf reads and writes Hugging Face model directories: safetensors files
// (the project's own reader and writer, following the format's published
// specification) and config.json, with Llama names for dense models, Mixtral
// names for MoE models whose every layer is MoE without shared experts, and
// Qwen2-MoE names otherwise (shared experts, interleaved dense layers); Qwen3
// and Qwen3-MoE names with QK-norm; Llama 4's text model (Llama4ForCausalLM,
// llama4.go) for Llama 4's router (the token scaled by its sigmoid score before
// its expert, a shared expert), NoPE layers and chunked attention; Glm4Moe
// names for DeepSeek-V3's sigmoid router over standard attention
// (glm4moe.go). DeepSeek-V3's own config.json (multi-head latent attention) is
// refused, naming MLA.
//
// # safetensors
//
// A file is an 8-byte little-endian header length N, N bytes of JSON mapping each
// tensor name to {dtype, shape, data_offsets: [begin, end]} (offsets relative to
// the byte after the header) plus an optional "__metadata__" map of strings, the
// header padded with spaces so the data starts 8-byte aligned, then the data,
// row-major, little-endian. Above a size limit the tensors are split over
// model-0000i-of-0000n.safetensors with model.safetensors.index.json naming the
// file of each.
//
// hf imports config and fileio.
package hf
