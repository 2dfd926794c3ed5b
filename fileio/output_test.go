package fileio

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// plantLink makes dir/name a symbolic link to a victim file outside dir and
// returns the victim's path, holding "precious".
func plantLink(t *testing.T, dir, name string) string {
	victim := filepath.Join(t.TempDir(), "victim")
	require.NoError(t, os.WriteFile(victim, []byte("precious"), 0o644))
	require.NoError(t, os.Symlink(victim, filepath.Join(dir, name)))
	return victim
}

func requireUntouched(t *testing.T, victim string) {
	t.Helper()
	b, err := os.ReadFile(victim)
	require.NoError(t, err)
	require.Equal(t, "precious", string(b))
}

// A symbolic link planted where an output goes is refused by every writer,
// naming it, and the file it points to is left as it was; a hard link is
// refused by the writers that write in place.
func TestWritersRefuseLinks(t *testing.T) {
	dir := t.TempDir()
	for name, write := range map[string]func(string) error{
		"atomic": func(p string) error { return WriteAtomic(p, []byte("x")) },
		"sealed": func(p string) error { return WriteSealed(p, []byte("x")) },
		"sealed writer": func(p string) error {
			w, err := CreateSealed(p, 1)
			if err == nil {
				err = w.Commit()
			}
			return err
		},
		"append": func(p string) error {
			f, err := OpenAppend(p)
			if err == nil {
				f.Close()
			}
			return err
		},
		"create": func(p string) error {
			f, err := Create(p)
			if err == nil {
				f.Close()
			}
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			victim := plantLink(t, dir, name)
			err := write(filepath.Join(dir, name))
			require.ErrorIs(t, err, ErrLink)
			assert.ErrorContains(t, err, filepath.Join(dir, name))
			assert.ErrorContains(t, err, "symbolic link to "+`"`+victim)
			requireUntouched(t, victim)
		})
	}
	for _, open := range []func(string) (*os.File, error){OpenAppend, Create} {
		victim := filepath.Join(t.TempDir(), "victim")
		require.NoError(t, os.WriteFile(victim, []byte("precious"), 0o644))
		hard := filepath.Join(dir, "hard")
		os.Remove(hard)
		require.NoError(t, os.Link(victim, hard))
		_, err := open(hard)
		require.ErrorIs(t, err, ErrLink)
		assert.ErrorContains(t, err, "2 hard links")
		requireUntouched(t, victim)
	}
	// What is not a link is written as before.
	f, err := OpenAppend(filepath.Join(dir, "log"))
	require.NoError(t, err)
	f.WriteString("a")
	f.Close()
	f, err = OpenAppend(filepath.Join(dir, "log"))
	require.NoError(t, err)
	f.WriteString("b")
	f.Close()
	b, _ := os.ReadFile(filepath.Join(dir, "log"))
	assert.Equal(t, "ab", string(b))
}

// ClaimDir: a new or empty directory is taken; a directory of someone else's
// files is refused unless overwrite; the command's own directory is taken
// again, and the files it wrote last time but not now are removed (an old
// shard index does not outlive the export that replaced it), while the files
// it never wrote stay.
func TestClaimDirOwnership(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "out")
	o, err := ClaimDir(dir, "ckpt export", []string{"a", "b", "index"}, false, "give an empty directory")
	require.NoError(t, err)
	for _, n := range []string{"a", "b", "index"} {
		require.NoError(t, o.WriteFile(n, []byte(n)))
	}
	require.Error(t, o.WriteFile("c", nil), "a name not claimed")
	require.NoError(t, o.Commit())
	require.NoError(t, os.WriteFile(filepath.Join(dir, "README.md"), []byte("mine"), 0o644))

	// The same command again, writing fewer files: the stale one goes.
	o, err = ClaimDir(dir, "ckpt export", []string{"a"}, false, "")
	require.NoError(t, err)
	require.NoError(t, o.WriteFile("a", []byte("A")))
	require.NoError(t, o.Commit())
	_, err = os.Stat(filepath.Join(dir, "index"))
	assert.ErrorIs(t, err, os.ErrNotExist)
	_, err = os.Stat(filepath.Join(dir, "README.md"))
	assert.NoError(t, err, "a file the command did not write stays")
	// ... but it may not replace one it did not write, nor remove one.
	_, err = ClaimDir(dir, "ckpt export", []string{"a", "README.md"}, false, "")
	require.ErrorIs(t, err, ErrNotOwned)
	assert.ErrorContains(t, err, filepath.Join(dir, "README.md"))
	o, err = ClaimDir(dir, "ckpt export", []string{"a"}, false, "")
	require.NoError(t, err)
	require.ErrorIs(t, o.Remove("README.md"), ErrNotOwned)

	// Another command's directory, and a directory of files without a manifest.
	_, err = ClaimDir(dir, "data prepare", []string{"a"}, false, "give an empty directory")
	require.ErrorIs(t, err, ErrNotOwned)
	assert.ErrorContains(t, err, "ckpt export wrote it")
	foreign := filepath.Join(root, "home")
	require.NoError(t, os.Mkdir(foreign, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(foreign, "notes.txt"), []byte("precious"), 0o644))
	_, err = ClaimDir(foreign, "data prepare", []string{"notes.txt"}, false, "give -o an empty directory")
	require.ErrorIs(t, err, ErrNotOwned)
	assert.ErrorContains(t, err, "it holds notes.txt and no "+ManifestFile+" of data prepare; give -o an empty directory, or pass --overwrite")
	requireUntouched(t, filepath.Join(foreign, "notes.txt"))
	// overwrite: the user's word.
	o, err = ClaimDir(foreign, "data prepare", []string{"notes.txt"}, true, "")
	require.NoError(t, err)
	require.NoError(t, o.WriteFile("notes.txt", []byte("new")))
	require.NoError(t, o.Commit())

	// A link as the directory, or as a file to write, is refused even so.
	victim := plantLink(t, root, "linkdir")
	_, err = ClaimDir(filepath.Join(root, "linkdir"), "ckpt export", []string{"a"}, true, "")
	require.ErrorIs(t, err, ErrLink)
	requireUntouched(t, victim)
	victim = plantLink(t, dir, "b")
	_, err = ClaimDir(dir, "ckpt export", []string{"a", "b"}, true, "")
	require.ErrorIs(t, err, ErrLink)
	requireUntouched(t, victim)
	// A name with a separator is no file of the directory.
	_, err = ClaimDir(dir, "ckpt export", []string{"../x"}, true, "")
	require.Error(t, err)
}
