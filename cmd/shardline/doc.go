// Command shardline is the command-line interface: lint, plan and inspect recipes.
//
// It is the only package that prints to the terminal or exits; everything it does
// is a call into config and parallel. Exit codes: 0 success, 1 the recipe has
// errors (or warnings with --strict), 2 the command could not run (bad flags, an
// unreadable file).
package main
