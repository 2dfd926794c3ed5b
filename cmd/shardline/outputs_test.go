package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tinyArgs runs recipes/tiny.toml cut down to a second, its run directory
// dir/runs/name.
func tinyArgs(dir, name string, more ...string) []string {
	return append([]string{"run", filepath.Join(recipesDir, "tiny.toml"), "--num-layers", "1", "--seq-length", "16", "--train-iters", "4",
		"--set", "train.eval_interval=0", "--set", "run.output_dir=" + filepath.Join(dir, "runs"), "--set", "run.name=" + name,
		"--set", "data.path=" + filepath.Join(dir, "t.txt")}, more...)
}

func writeText(t *testing.T, dir string) {
	require.NoError(t, os.WriteFile(filepath.Join(dir, "t.txt"), []byte(strings.Repeat("abcd efgh ijkl mnop. ", 200)), 0o644))
}

// An export into a directory holding an older sharded export leaves no index
// behind (before, the old model.safetensors.index.json stayed and a loader
// read the old shards instead of the new model.safetensors); an export into a
// directory of files no export made is refused, naming them, unless
// --overwrite; an export is never written through a planted link.
func TestExportOwnsItsDirectory(t *testing.T) {
	dir := t.TempDir()
	writeText(t, dir)
	for _, name := range []string{"a", "b"} {
		code, _, errs := shardline(t, nil, tinyArgs(dir, name, "--lr", map[string]string{"a": "0.01", "b": "0.003"}[name])...)
		require.Equal(t, 0, code, errs)
	}
	out := filepath.Join(dir, "hf")
	code, _, errs := shardline(t, nil, "ckpt", "export", filepath.Join(dir, "runs", "a"), "-o", out, "--shard-size", "1")
	require.Equal(t, 0, code, errs)
	_, err := os.Stat(filepath.Join(out, "model.safetensors.index.json"))
	require.NoError(t, err, "run a exports in shards")
	code, _, errs = shardline(t, nil, "ckpt", "export", filepath.Join(dir, "runs", "b"), "-o", out)
	require.Equal(t, 0, code, errs)
	names, err := filepath.Glob(filepath.Join(out, "model*"))
	require.NoError(t, err)
	assert.Equal(t, []string{filepath.Join(out, "model.safetensors")}, names, "the old index and shards are gone")
	// What is there is run b's export, as a fresh directory gets it.
	fresh := filepath.Join(dir, "hf-b")
	code, _, errs = shardline(t, nil, "ckpt", "export", filepath.Join(dir, "runs", "b"), "-o", fresh)
	require.Equal(t, 0, code, errs)
	assert.Equal(t, must(os.ReadFile(filepath.Join(fresh, "model.safetensors"))), must(os.ReadFile(filepath.Join(out, "model.safetensors"))))

	// Someone else's directory.
	home := filepath.Join(dir, "home")
	require.NoError(t, os.Mkdir(home, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(home, "notes.txt"), []byte("precious"), 0o644))
	code, _, errs = shardline(t, nil, "ckpt", "export", filepath.Join(dir, "runs", "a"), "-o", home)
	assert.Equal(t, 1, code)
	assert.Contains(t, errs, home+": not written by this command: it holds notes.txt and no .shardline-outputs.json of shardline ckpt export; give -o a new or empty directory, or pass --overwrite")
	entries, _ := os.ReadDir(home)
	assert.Len(t, entries, 1, "nothing written")
	code, _, errs = shardline(t, nil, "ckpt", "export", filepath.Join(dir, "runs", "a"), "-o", home, "--overwrite")
	require.Equal(t, 0, code, errs)
	assert.Equal(t, "precious", string(must(os.ReadFile(filepath.Join(home, "notes.txt")))), "--overwrite replaces only what export writes")

	// A link planted where the weights go.
	victim := filepath.Join(dir, "victim")
	require.NoError(t, os.WriteFile(victim, []byte("precious"), 0o644))
	require.NoError(t, os.Remove(filepath.Join(out, "config.json")))
	require.NoError(t, os.Symlink(victim, filepath.Join(out, "config.json")))
	code, _, errs = shardline(t, nil, "ckpt", "export", filepath.Join(dir, "runs", "a"), "-o", out, "--overwrite")
	assert.Equal(t, 1, code)
	assert.Contains(t, errs, filepath.Join(out, "config.json")+": output through a link refused: a symbolic link to")
	assert.Equal(t, "precious", string(must(os.ReadFile(victim))))
}

// data prepare -o replaces files only in a directory it made: a directory of
// someone else's files (a train.tok among them) is refused and left as it was
// unless --overwrite; its own directory it prepares again.
func TestPrepareOwnsItsDirectory(t *testing.T) {
	dir := t.TempDir()
	writeText(t, dir)
	text := filepath.Join(dir, "t.txt")
	theirs := filepath.Join(dir, "theirs")
	require.NoError(t, os.Mkdir(theirs, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(theirs, "train.tok"), []byte("precious"), 0o644))
	code, _, errs := shardline(t, nil, "data", "prepare", "--tokenizer", "char", "-o", theirs, text)
	assert.Equal(t, 1, code)
	assert.Contains(t, errs, theirs+": not written by this command: it holds train.tok and no .shardline-outputs.json of shardline data prepare")
	assert.Contains(t, errs, "pass --overwrite")
	assert.Equal(t, "precious", string(must(os.ReadFile(filepath.Join(theirs, "train.tok")))))
	code, _, errs = shardline(t, nil, "data", "prepare", "--tokenizer", "char", "-o", theirs, "--overwrite", text)
	require.Equal(t, 0, code, errs)

	mine := filepath.Join(dir, "prepared")
	for i := 0; i < 2; i++ { // new, then its own
		code, _, errs = shardline(t, nil, "data", "prepare", "--tokenizer", "byte", "-o", mine, text)
		require.Equal(t, 0, code, errs)
	}
	victim := filepath.Join(dir, "victim")
	require.NoError(t, os.WriteFile(victim, []byte("precious"), 0o644))
	require.NoError(t, os.Remove(filepath.Join(mine, "tokenizer.json")))
	require.NoError(t, os.Symlink(victim, filepath.Join(mine, "tokenizer.json")))
	code, _, errs = shardline(t, nil, "data", "prepare", "--tokenizer", "byte", "-o", mine, text)
	assert.Equal(t, 1, code)
	assert.Contains(t, errs, filepath.Join(mine, "tokenizer.json")+": output through a link refused: a symbolic link to")
	assert.Equal(t, "precious", string(must(os.ReadFile(victim))))
}

// A file planted as a symbolic link in a run directory is not written
// through: resuming the run refuses it, naming it (or, for run.json, which
// then no longer proves the directory is the run's, branches into a new run
// directory), and the file it points to stays as it was (before, run.log and metrics.jsonl were appended to or
// truncated through the link, and run.json, sample.txt and loss.png
// replaced what it named). The run.json link points at a copy of the run's
// own run.json: it was followed, the resume continued in place and rewrote
// resolved.toml and plan.txt before failing on run.json.
func TestRunWritesNoOutputThroughALink(t *testing.T) {
	dir := t.TempDir()
	writeText(t, dir)
	code, _, errs := shardline(t, nil, tinyArgs(dir, "r", "--set", "checkpoint.interval=2", "--train-iters", "2")...)
	require.Equal(t, 0, code, errs)
	run := filepath.Join(dir, "runs", "r")
	for _, name := range []string{"run.log", "metrics.jsonl", "run.json", "resolved.toml", "sample.txt", "loss.png", "weights.bin"} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(run, name)
			saved := must(os.ReadFile(path))
			precious := "precious"
			if name == "run.json" {
				precious = string(saved) // the run's own id: only the link says it is not the run's
			}
			victim := filepath.Join(t.TempDir(), "victim")
			require.NoError(t, os.WriteFile(victim, []byte(precious), 0o644))
			before := map[string][]byte{}
			for _, n := range []string{"resolved.toml", "plan.txt", "metrics.jsonl"} {
				before[n] = must(os.ReadFile(filepath.Join(run, n)))
			}
			require.NoError(t, os.Remove(path))
			require.NoError(t, os.Symlink(victim, path))
			code, _, errs := shardline(t, nil, tinyArgs(dir, "r", "--set", "checkpoint.interval=2", "--train-iters", "4", "--resume", run)...)
			if name == "run.json" {
				// A directory whose run.json is not the run's own no longer
				// proves it is the run's: the resume branches into a new run
				// directory (docs/robustness.md, "Who owns a run directory").
				assert.Equal(t, 0, code, errs)
				assert.DirExists(t, filepath.Join(dir, "runs", "r-2"))
				require.NoError(t, os.RemoveAll(filepath.Join(dir, "runs", "r-2")))
				for n, b := range before {
					assert.Equal(t, string(b), string(must(os.ReadFile(filepath.Join(run, n)))), "%s of the run is untouched", n)
				}
			} else {
				assert.NotEqual(t, 0, code)
				assert.Contains(t, errs, path+": output through a link refused: a symbolic link to \""+victim+"\"")
			}
			assert.Equal(t, precious, string(must(os.ReadFile(victim))), "the file the link names is untouched")
			require.NoError(t, os.Remove(path))
			require.NoError(t, os.WriteFile(path, saved, 0o644))
		})
	}
}

// --cpuprofile is not written through a link (before, os.Create truncated
// the file the link named).
func TestFileFlagsRefuseLinks(t *testing.T) {
	dir := t.TempDir()
	writeText(t, dir)
	victim := filepath.Join(dir, "victim")
	require.NoError(t, os.WriteFile(victim, []byte("precious"), 0o644))
	link := filepath.Join(dir, "out")
	require.NoError(t, os.Symlink(victim, link))
	code, _, errs := shardline(t, nil, tinyArgs(dir, "p", "--cpuprofile", link)...)
	assert.Equal(t, 2, code)
	assert.Contains(t, errs, "--cpuprofile "+link+": output through a link refused: a symbolic link to \""+victim+"\"")
	assert.Equal(t, "precious", string(must(os.ReadFile(victim))))
}
