// Package shardline is the root of the shardline module: a trainer for Llama-style
// language models driven by TOML recipes. The code lives in the packages below; this
// package only holds the test that keeps their imports pointing down
// (ARCHITECTURE.md: "imports point down only; a test enforces it").
package shardline
