package fileio

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
)

// ErrLink marks an output path that is a symbolic link, or a file with more
// than one hard link: writing through it would change a file elsewhere, one
// no command of shardline made.
var ErrLink = errors.New("output through a link refused")

// ErrNotOwned marks an output directory, or a file in one, that the command
// writing it did not make (its manifest does not list it).
var ErrNotOwned = errors.New("not written by this command")

// checkTarget refuses an output path that is a symbolic link or not a
// regular file; a path that does not exist passes.
func checkTarget(path string) error {
	st, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return err
	case st.Mode()&fs.ModeSymlink != 0:
		return linkError(path)
	case !st.Mode().IsRegular():
		return &fs.PathError{Op: "write", Path: path, Err: fmt.Errorf("%w (%s): an output is written only over a regular file", ErrNotRegular, kind(st.Mode()))}
	}
	return nil
}

// linkError is the error for an output path that is a symbolic link.
func linkError(path string) error {
	target, _ := os.Readlink(path)
	return &fs.PathError{Op: "write", Path: path, Err: fmt.Errorf("%w: a symbolic link to %q (remove the link, or write elsewhere)", ErrLink, target)}
}

// OpenAppend opens path for appending (a log), creating it if missing. It
// never follows a symbolic link (O_NOFOLLOW) and refuses anything but a
// regular file, and a file with other hard links, since appending would
// change that file too.
func OpenAppend(path string) (*os.File, error) {
	return openOutput(path, os.O_APPEND)
}

// Create creates or truncates path for writing, refusing what OpenAppend
// refuses: for an output streamed to a file the user named (a profile),
// where an atomic rename cannot serve.
func Create(path string) (*os.File, error) {
	f, err := openOutput(path, 0)
	if err == nil {
		// Truncated only now: O_TRUNC would cut a hard-linked file before the check.
		if err = f.Truncate(0); err != nil {
			f.Close()
			return nil, err
		}
	}
	return f, err
}

func openOutput(path string, flag int) (*os.File, error) {
	if err := checkTarget(path); err != nil {
		return nil, err
	}
	// O_NONBLOCK: a FIFO swapped in after the check does not block the open.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|flag|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0o644)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return nil, linkError(path)
		}
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, &fs.PathError{Op: "write", Path: path, Err: fmt.Errorf("%w (%s)", ErrNotRegular, kind(st.Mode()))}
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && sys.Nlink > 1 {
		f.Close()
		return nil, &fs.PathError{Op: "write", Path: path, Err: fmt.Errorf("%w: the file has %d hard links; writing would change the others (remove it, or write elsewhere)", ErrLink, sys.Nlink)}
	}
	return f, nil
}

// ManifestFile is the file in an output directory that names the command
// that wrote it and the files it wrote: what makes the directory the
// command's (OutputDir).
const ManifestFile = ".shardline-outputs.json"

// manifest is ManifestFile.
type manifest struct {
	WrittenBy string   `json:"written_by"`
	Files     []string `json:"files"`
}

// OutputDir is a directory a command writes a known set of files into. The
// command owns the directory when its manifest (ManifestFile) is there and
// names the command: it may then replace the files the manifest lists, and
// it removes those it no longer writes. Anything else there is left alone.
type OutputDir struct {
	dir, command string
	names        []string
	owned        map[string]bool // files the old manifest lists; nil when overwriting: any
}

// ClaimDir prepares dir to receive the files names from command. A missing
// directory is made; an empty one, or one whose manifest names command, is
// taken. A non-empty directory without that manifest, or with another
// command's, is refused (ErrNotOwned, naming what it holds, with fix: what to
// give instead), and so is a file to be written that exists but the manifest
// does not list, unless overwrite is set. A dir that is a symbolic link, or a
// file to be written that is one, is refused (ErrLink) even so. The manifest,
// listing the old files and names, is written before anything else, and the
// files the command's old manifest lists but names does not are removed: a
// sharded export replaced by one file leaves no index behind.
func ClaimDir(dir, command string, names []string, overwrite bool, fix string) (*OutputDir, error) {
	o := &OutputDir{dir: dir, command: command, names: slices.Clone(names), owned: map[string]bool{}}
	for _, n := range names {
		if n != filepath.Base(n) || n == ManifestFile || n == "." || n == ".." {
			return nil, fmt.Errorf("%s: %q is not a file name an output may have", dir, n)
		}
	}
	st, err := os.Lstat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
	case err != nil:
		return nil, err
	case st.Mode()&fs.ModeSymlink != 0:
		return nil, linkError(dir)
	case !st.IsDir():
		return nil, &fs.PathError{Op: "write", Path: dir, Err: fmt.Errorf("it is %s, not a directory; %s", kind(st.Mode()), fix)}
	}
	old, err := readManifest(dir)
	if err != nil {
		return nil, err
	}
	mine := old != nil && old.WrittenBy == command
	if mine {
		for _, f := range old.Files {
			o.owned[f] = true
		}
	}
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var foreign []string
	for _, de := range des {
		if n := de.Name(); n != ManifestFile && !o.owned[n] {
			foreign = append(foreign, n)
		}
	}
	if !overwrite {
		switch {
		case old != nil && !mine:
			return nil, &fs.PathError{Op: "write", Path: dir, Err: fmt.Errorf("%w: its %s says %s wrote it; %s, or pass --overwrite", ErrNotOwned, ManifestFile, old.WrittenBy, fix)}
		case old == nil && len(foreign) > 0:
			return nil, &fs.PathError{Op: "write", Path: dir, Err: fmt.Errorf("%w: it holds %s and no %s of %s; %s, or pass --overwrite to replace the files it writes (%s)", ErrNotOwned, listNames(foreign), ManifestFile, command, fix, strings.Join(names, ", "))}
		}
		for _, n := range names {
			if slices.Contains(foreign, n) {
				return nil, &fs.PathError{Op: "write", Path: filepath.Join(dir, n), Err: fmt.Errorf("%w: it is there, but %s does not list it; remove it, %s, or pass --overwrite", ErrNotOwned, ManifestFile, fix)}
			}
		}
	}
	for _, n := range names {
		if err := checkTarget(filepath.Join(dir, n)); err != nil {
			return nil, err
		}
	}
	var stale []string
	for f := range o.owned {
		if !slices.Contains(names, f) {
			stale = append(stale, f)
		}
	}
	sort.Strings(stale)
	if err := o.writeManifest(append(slices.Clone(names), stale...)); err != nil {
		return nil, err
	}
	for _, f := range stale {
		if err := o.remove(f); err != nil {
			return nil, err
		}
	}
	if overwrite {
		o.owned = nil // any file may be replaced or removed
	}
	return o, nil
}

// listNames lists a directory's entries for an error: the first few, and how
// many more.
func listNames(names []string) string {
	sort.Strings(names)
	if len(names) > 4 {
		return fmt.Sprintf("%s and %d more", strings.Join(names[:4], ", "), len(names)-4)
	}
	return strings.Join(names, ", ")
}

// readManifest reads dir's manifest; nil when there is none.
func readManifest(dir string) (*manifest, error) {
	path := filepath.Join(dir, ManifestFile)
	if err := checkTarget(path); err != nil {
		return nil, err
	}
	b, err := ReadRegular(path, 1<<20)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var m manifest
	if err := json.Unmarshal(b, &m); err != nil || m.WrittenBy == "" {
		return nil, fmt.Errorf("%s: %w: not a manifest shardline wrote (remove it to write here)", path, ErrCorrupt)
	}
	for _, f := range m.Files {
		if f != filepath.Base(f) || f == ManifestFile || f == "." || f == ".." {
			return nil, fmt.Errorf("%s: %w: it lists %q, not a file of the directory (remove it to write here)", path, ErrCorrupt, f)
		}
	}
	return &m, nil
}

func (o *OutputDir) writeManifest(files []string) error {
	b, err := json.MarshalIndent(manifest{WrittenBy: o.command, Files: files}, "", "  ")
	if err != nil {
		return err
	}
	return WriteAtomic(filepath.Join(o.dir, ManifestFile), append(b, '\n'))
}

// remove deletes one of the directory's files; a missing one is no error.
func (o *OutputDir) remove(name string) error {
	path := filepath.Join(o.dir, name)
	st, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return err
	case !st.Mode().IsRegular() && st.Mode()&fs.ModeSymlink == 0:
		return &fs.PathError{Op: "remove", Path: path, Err: fmt.Errorf("it is %s; remove it by hand", kind(st.Mode()))}
	}
	return os.Remove(path) // a link is removed itself, never what it names
}

// Path is the path of one of the directory's files.
func (o *OutputDir) Path(name string) string { return filepath.Join(o.dir, name) }

// WriteFile writes one of the names given to ClaimDir, atomically.
func (o *OutputDir) WriteFile(name string, data []byte) error {
	if !slices.Contains(o.names, name) {
		return fmt.Errorf("%s: %s was not claimed", o.dir, name)
	}
	return WriteAtomic(o.Path(name), data)
}

// Remove deletes a file of the directory that the command no longer writes
// (one a reader would otherwise take for part of the output): it must be
// one the manifest listed, or overwrite set; otherwise ErrNotOwned.
func (o *OutputDir) Remove(name string) error {
	if o.owned != nil && !o.owned[name] {
		return &fs.PathError{Op: "remove", Path: o.Path(name), Err: fmt.Errorf("%w: %s does not list it, and %s would read it with what it writes now; remove it, or pass --overwrite", ErrNotOwned, ManifestFile, o.command)}
	}
	return o.remove(name)
}

// Add claims one more file name after ClaimDir (a command that learns how many
// files it writes as it goes, such as data prepare's shards), with ClaimDir's
// checks: a name that is not a plain file name, a link, or a file there that
// the manifest does not list (unless overwrite) is refused. The manifest is
// rewritten to list it before it is written.
func (o *OutputDir) Add(name string) error {
	if name != filepath.Base(name) || name == ManifestFile || name == "." || name == ".." {
		return fmt.Errorf("%s: %q is not a file name an output may have", o.dir, name)
	}
	if slices.Contains(o.names, name) {
		return nil
	}
	path := o.Path(name)
	if err := checkTarget(path); err != nil {
		return err
	}
	if _, err := os.Lstat(path); err == nil && o.owned != nil && !o.owned[name] {
		return &fs.PathError{Op: "write", Path: path, Err: fmt.Errorf("%w: it is there, but %s does not list it; remove it, or pass --overwrite", ErrNotOwned, ManifestFile)}
	}
	o.names = append(o.names, name)
	return o.writeManifest(o.names)
}

// Commit writes the manifest listing the names given to ClaimDir: the files
// the command wrote.
func (o *OutputDir) Commit() error { return o.writeManifest(o.names) }
