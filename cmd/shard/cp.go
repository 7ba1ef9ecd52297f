package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/files"
	"github.com/useshards/shard/internal/termsafe"
)

func newCpCmd(a *app) *cobra.Command {
	var follow bool
	cmd := &cobra.Command{
		Use:   "cp [-L] SRC DEST",
		Short: "Copy files between a sandbox (running or stopped) and here",
		Long: `Copy files and directories between a sandbox and the local filesystem, as
'docker cp' does. One of SRC and DEST is SANDBOX:PATH (a sandbox path is
taken from the sandbox's /; a local path that has a colon starts with / or
./). A directory is copied with all it holds; owner, mode and modification
time are kept (a local owner only when run as root). Either side may be -:
a tar stream on stdin (unpacked into the sandbox directory DEST) or stdout
(the archive of SRC).

  SRC is a file:
    DEST does not exist      the file is saved as DEST
    DEST ends with /         DEST must be an existing directory
    DEST is a file           it is replaced
    DEST is a directory      the file goes into it, under its own name
  SRC is a directory:
    DEST does not exist      DEST is made, with SRC's contents
    DEST is a directory      SRC goes into it (DEST/NAME); with SRC ending
                             in /. its contents go into DEST
    DEST is a file           an error

A symlink in SRC is copied as a symlink; with -L, or a SRC that ends in / or
/., a SRC that is a symlink is copied as what it names (a sandbox's resolved
in the sandbox). Nothing from a sandbox lands outside DEST: entries that lead
out are refused, device nodes are skipped and setuid bits removed (each said
on stderr). A sparse file's holes are not sent and stay holes, both ways; out
of a sandbox, blocks of zeros are written as holes too, so a copy takes here
no more than the data it carries (a tar on stdout has whole files).

  shard cp ./app box:/srv/app
  shard cp box:/var/log/app.log .
  shard cp box:/srv/out/. ./results
  tar c data | shard cp - box:/data`,
		Args: exactArgs(2, "a SRC and a DEST, one of them SANDBOX:PATH"),
		RunE: func(cmd *cobra.Command, args []string) error {
			srcSB, srcPath, srcRemote := splitCopyArg(args[0])
			dstSB, dstPath, dstRemote := splitCopyArg(args[1])
			switch {
			case srcRemote && dstRemote:
				return errors.New("both SRC and DEST are in sandboxes: copy out to here, then in")
			case !srcRemote && !dstRemote:
				return errors.New("neither SRC nor DEST is in a sandbox: give one as SANDBOX:PATH")
			}
			if (srcRemote && srcPath == "") || (dstRemote && dstPath == "") {
				return errors.New("a sandbox side needs a path: SANDBOX:PATH (SANDBOX:/ for its root)")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			if srcRemote {
				return copyOut(cmd.Context(), c, srcSB, srcPath, dstPath, follow)
			}
			return copyIn(cmd.Context(), c, srcPath, dstSB, dstPath, follow)
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow-link", "L", false, "copy a SRC that is a symlink as what it names")
	return cmd
}

// splitCopyArg tells a SANDBOX:PATH from a local path (one that starts
// with / or ., or has no colon). A sandbox path is made absolute.
func splitCopyArg(arg string) (sandbox, p string, remote bool) {
	if arg == "-" || strings.HasPrefix(arg, "/") || strings.HasPrefix(arg, ".") {
		return "", arg, false
	}
	sb, p, ok := strings.Cut(arg, ":")
	if !ok || sb == "" {
		return "", arg, false
	}
	if p != "" && !strings.HasPrefix(p, "/") {
		p = "/" + p
	}
	return sb, p, true
}

// contentsOnly reports a SRC that ends in /. (its contents, not itself).
func contentsOnly(p string) bool { return p == "." || strings.HasSuffix(p, "/.") }

// hasTrailingSlash reports a DEST written as a directory.
func hasTrailingSlash(p string) bool { return len(p) > 1 && strings.HasSuffix(p, "/") }

func printNotes(notes []string) {
	for _, n := range notes {
		termsafe.Fprintln(os.Stderr, "shard cp:", n)
	}
}

// copyOut copies srcPath of sandbox sb to the local dst. Its files that
// have holes come as their data and are written with the same holes, and
// blocks of zeros of those sent whole are left holes: what the copy writes
// here is the data it carries, whatever size the sandbox claims. A tar on
// stdout, for other tools, has whole files.
func copyOut(ctx context.Context, c *client.Client, sb, srcPath, dst string, follow bool) error {
	read := c.ReadSparseArchive
	if dst == "-" {
		read = c.ReadArchive
	}
	rc, info, err := read(ctx, sb, srcPath, follow)
	if err != nil {
		return err
	}
	defer rc.Close()
	if dst == "-" {
		if _, err := io.Copy(os.Stdout, rc); err != nil {
			return fmt.Errorf("copying %s:%s broke off: %w", sb, srcPath, err)
		}
		return nil
	}
	srcDir := info.Type == "dir"
	top := path.Base(path.Clean(srcPath))
	if path.Clean(srcPath) == "/" {
		top = "."
	}
	// into: the local directory the archive unpacks into; as: the name its
	// top entry gets there ("" to leave it out: its contents go to into).
	var into, as string
	fi, err := os.Stat(dst)
	switch {
	case err == nil && fi.IsDir():
		into, as = dst, top
		if contentsOnly(srcPath) && srcDir {
			as = ""
		}
	case err == nil:
		if srcDir {
			return fmt.Errorf("cannot copy directory %s:%s to %s, a file", sb, srcPath, dst)
		}
		into, as = filepath.Dir(dst), filepath.Base(dst)
	case errors.Is(err, fs.ErrNotExist):
		if hasTrailingSlash(dst) && !srcDir {
			return fmt.Errorf("directory %s does not exist", dst)
		}
		into, as = filepath.Dir(filepath.Clean(dst)), filepath.Base(filepath.Clean(dst))
		if pfi, err := os.Stat(into); err != nil || !pfi.IsDir() {
			return fmt.Errorf("directory %s does not exist: make it first", into)
		}
	default:
		return err
	}
	res := files.Unpack(rc, into, files.UnpackOptions{
		KeepOwner: os.Geteuid() == 0,
		Rename:    renameTop(top, as),
		Holes:     true,
	})
	printNotes(res.Notes)
	if !res.OK {
		return fmt.Errorf("copy of %s:%s to %s: %s", sb, srcPath, dst, res.Message)
	}
	// An archive cut short ends without its last blocks, which tar's
	// reader does not insist on: the body's own error says so.
	if _, err := io.Copy(io.Discard, rc); err != nil {
		return fmt.Errorf("copying %s:%s broke off: %w", sb, srcPath, err)
	}
	return nil
}

// renameTop maps an archive's entry names from top/... to as/...; with as
// "" the top entry is left out and what is under it keeps its own name.
func renameTop(top, as string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		rest, under := "", false
		switch {
		case top == ".":
			rest, under = name, name != ""
		case name == top:
		case strings.HasPrefix(name, top+"/"):
			rest, under = name[len(top)+1:], true
		default:
			return "", false // not from the archive's top (the server sends none)
		}
		if as == "" {
			return rest, under
		}
		if !under {
			return as, true
		}
		return as + "/" + rest, true
	}
}

// copyIn copies the local src into sandbox sb at dstPath.
func copyIn(ctx context.Context, c *client.Client, src, sb, dstPath string, follow bool) error {
	if src == "-" {
		res, err := c.WriteArchive(ctx, sb, dstPath, os.Stdin)
		if err != nil {
			return err
		}
		printNotes(res.Notes)
		return nil
	}
	stat := os.Lstat
	if follow {
		stat = os.Stat
	}
	fi, err := stat(src)
	if err != nil {
		return err
	}
	root := src
	if follow {
		if root, err = filepath.EvalSymlinks(src); err != nil {
			return err
		}
	}
	base := filepath.Base(filepath.Clean(src))
	if fi.Mode().IsRegular() {
		return copyFileIn(ctx, c, sb, dstPath, root, base, fi)
	}
	dst, err := c.StatFile(ctx, sb, dstPath, true)
	exists := err == nil
	if err != nil && !isNotFound(err) {
		return err
	}
	switch {
	case exists && dst.Type == "dir":
		return sendTar(ctx, c, sb, dstPath, root, base, fi.IsDir() && contentsOnly(src))
	case exists:
		if fi.IsDir() {
			return fmt.Errorf("cannot copy directory %s to %s:%s, a file", src, sb, dstPath)
		}
		return sendTar(ctx, c, sb, path.Dir(dstPath), root, path.Base(dstPath), false)
	}
	if hasTrailingSlash(dstPath) && !fi.IsDir() {
		return fmt.Errorf("directory %s:%s does not exist", sb, dstPath)
	}
	clean := path.Clean(dstPath)
	parent := path.Dir(clean)
	if pi, err := c.StatFile(ctx, sb, parent, true); err != nil {
		if isNotFound(err) {
			return fmt.Errorf("directory %s:%s does not exist: make it first", sb, parent)
		}
		return err
	} else if pi.Type != "dir" {
		return fmt.Errorf("%s:%s is not a directory", sb, parent)
	}
	return sendTar(ctx, c, sb, parent, root, path.Base(clean), false)
}

// copyFileIn copies the regular file src (named base) into sandbox sb at
// dstPath, asking the sandbox no more than it must (each question is a
// runtime exec of the files helper in it, 0.1 to 0.2 s). A DEST/ is a
// directory the file goes into; any other DEST is stated once, to tell a
// directory (the file goes into it) from the name to save the file as.
// That the directory the file lands in exists the write itself checks.
func copyFileIn(ctx context.Context, c *client.Client, sb, dstPath, src, base string, fi fs.FileInfo) error {
	target := path.Clean(dstPath)
	if hasTrailingSlash(dstPath) {
		target = path.Join(dstPath, base)
	} else if dst, err := c.StatFile(ctx, sb, dstPath, true); err == nil && dst.Type == "dir" {
		target = path.Join(dstPath, base)
	} else if err != nil && !isNotFound(err) {
		return err
	}
	err := writeOne(ctx, c, sb, target, src, fi)
	if isNotFound(err) { // a write finds nothing missing but its directory
		return fmt.Errorf("directory %s:%s does not exist: make it first", sb, path.Dir(target))
	}
	return err
}

// isNotFound reports a sandbox path that does not exist.
func isNotFound(err error) bool {
	var ce *client.Error
	return errors.As(err, &ce) && ce.Code == files.CodeNotFound
}

// writeOne copies one regular file, with its mode, owner and time; one
// that has holes as its data (they stay holes in the sandbox).
func writeOne(ctx context.Context, c *client.Client, sb, dstPath, src string, fi fs.FileInfo) error {
	mode := uint32(fi.Mode().Perm())
	o := &client.WriteFileOptions{Mode: &mode, MTime: fi.ModTime()}
	if uid, gid, ok := owner(fi); ok {
		o.UID, o.GID = &uid, &gid
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	holes := ok && st.Blocks*512 < fi.Size()
	var res *client.WriteResult
	var err error
	if holes {
		res, err = pipeTar(ctx, src, filepath.Base(src), files.TarOptions{Sparse: true}, func(r io.Reader) (*client.WriteResult, error) {
			return c.WriteSparseFile(ctx, sb, dstPath, r, o)
		})
	}
	if !holes || sentWhole(err) {
		res, err = writeWhole(ctx, c, sb, dstPath, src, o)
	}
	if err != nil {
		return err
	}
	printNotes(res.Notes)
	return nil
}

func writeWhole(ctx context.Context, c *client.Client, sb, dstPath, src string, o *client.WriteFileOptions) (*client.WriteResult, error) {
	f, err := os.Open(src)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return c.WriteFile(ctx, sb, dstPath, f, o)
}

// sendTar streams a tar of root (named name, or its contents) into the
// sandbox directory dir, its files that have holes as their data.
func sendTar(ctx context.Context, c *client.Client, sb, dir, root, name string, contents bool) error {
	o := files.TarOptions{ContentsOnly: contents, Sparse: true}
	res, err := pipeTar(ctx, root, name, o, func(r io.Reader) (*client.WriteResult, error) {
		return c.WriteSparseArchive(ctx, sb, dir, r)
	})
	if sentWhole(err) {
		o.Sparse = false
		res, err = pipeTar(ctx, root, name, o, func(r io.Reader) (*client.WriteResult, error) {
			return c.WriteArchive(ctx, sb, dir, r)
		})
	}
	if err != nil {
		return err
	}
	printNotes(res.Notes)
	return nil
}

// sentWhole reports a refusal of files sent as their data by a sandbox
// whose files helper is an older shard's: they are sent again whole.
func sentWhole(err error) bool {
	var ce *client.Error
	return errors.As(err, &ce) && ce.Code == client.CodeUnsupported
}

// pipeTar sends a tar of root (files.WriteTar) through send, which reads
// it as it is written.
func pipeTar(ctx context.Context, root, name string, o files.TarOptions, send func(io.Reader) (*client.WriteResult, error)) (*client.WriteResult, error) {
	pr, pw := io.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		pw.CloseWithError(files.WriteTar(ctx, pw, root, name, o))
	}()
	res, err := send(pr)
	pr.CloseWithError(errors.New("the upload ended"))
	<-done
	return res, err
}

// owner is fi's numeric owner.
func owner(fi fs.FileInfo) (uid, gid int, ok bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, 0, false
	}
	return int(st.Uid), int(st.Gid), true
}
