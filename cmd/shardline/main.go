// Command shardline trains decoder-only language models from TOML recipes; see
// doc.go and `shardline --help`.
package main

import (
	"os"
)

func main() {
	os.Exit(Main(os.Args[1:], os.Stdout, os.Stderr, os.Environ()))
}
