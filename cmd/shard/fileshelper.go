package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/useshards/shard/internal/files"
	"github.com/useshards/shard/internal/termsafe"
	"golang.org/x/sys/unix"
)

// newFilesHelperCmd is the process that reads and writes a sandbox's files
// for the server (internal/files): inside a running sandbox as an exec of
// the agent's binary, or on the host chrooted (--root) into a stopped
// sandbox's files. It speaks files' protocol on its stdio.
func newFilesHelperCmd() *cobra.Command {
	var (
		root                                           string
		follow, asTar, parents, rec, sparse, readHoles bool
		mode                                           string
		uid, gid, limit                                int
		size, mtime                                    int64
	)
	cmd := &cobra.Command{
		Use:    files.HelperCommand + " stat|list|get|put|rm PATH",
		Short:  "Read or write a sandbox's files (the server runs it)",
		Hidden: true,
		Args:   cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if root != "" {
				// Before anything else: from here every path is the
				// sandbox's, resolved by the kernel in its root.
				if err := unix.Chroot(root); err != nil {
					return fmt.Errorf("chroot %s: %w", root, err)
				}
				if err := unix.Chdir("/"); err != nil {
					return err
				}
			}
			if args[0] != files.OpPut {
				// main's context catches SIGTERM; a helper that reads
				// (stat, list, get, rm) ends on one: the server gives up on
				// it so, through the runtime's exec.
				signal.Reset(syscall.SIGTERM, syscall.SIGINT)
			}
			out := bufio.NewWriterSize(os.Stdout, 64<<10)
			defer out.Flush()
			op, p := args[0], args[1]
			switch op {
			case files.OpStat:
				return files.WriteResult(out, files.Stat(p, follow))
			case files.OpList:
				return files.WriteResult(out, files.List(p, limit))
			case files.OpRemove:
				return files.WriteResult(out, files.Remove(p, rec))
			case files.OpGet:
				// A read stops once nobody reads it: the server closes
				// the pipe, and its SIGTERM may not reach this process.
				ctx, stop := files.WatchOutput(cmd.Context(), syscall.Stdout, time.Second)
				defer stop()
				if err := files.Get(ctx, out, p, files.GetOptions{Tar: asTar, Follow: follow, Sparse: sparse, ReadHoles: readHoles}); err != nil {
					out.Flush()
					termsafe.Fprintln(os.Stderr, err)
					os.Exit(2)
				}
				return nil
			case files.OpPut:
				o := files.PutOptions{Tar: asTar, Mode: -1, UID: uid, GID: gid, Size: size, Parents: parents, Sparse: sparse}
				if mode != "" {
					m, err := strconv.ParseUint(mode, 8, 32)
					if err != nil || m > 0o7777 {
						return files.WriteResult(out, files.Failed(&files.Error{Code: files.CodeInvalid, Msg: fmt.Sprintf("bad mode %q: octal, at most 7777", mode)}))
					}
					o.Mode = int64(m)
				}
				if mtime != 0 {
					o.MTime = time.Unix(0, mtime)
				}
				// SIGTERM is the server giving up on the upload: stop, and
				// remove the file half written.
				ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
				defer stop()
				// Stdin non-blocking, under the runtime's poller: only then
				// does a Close end a read that waits on it.
				stdin := os.Stdin
				if syscall.SetNonblock(0, true) == nil {
					stdin = os.NewFile(0, "stdin")
				}
				context.AfterFunc(ctx, func() { stdin.Close() })
				return files.WriteResult(out, files.Put(ctx, files.NewChunkReader(bufio.NewReaderSize(stdin, 1<<20)), p, o))
			}
			return fmt.Errorf("unknown operation %q", op)
		},
	}
	f := cmd.Flags()
	f.StringVar(&root, "root", "", "chroot into DIR first (a stopped sandbox's files, on the host)")
	f.BoolVar(&follow, "follow", false, "follow PATH when it is a symlink")
	f.BoolVar(&asTar, "tar", false, "get: a tar of PATH; put: unpack a tar into the directory PATH")
	f.BoolVar(&parents, "parents", false, "put: make missing parent directories")
	f.BoolVar(&sparse, "sparse", false, "get: send a tar's files that have holes as their data; put: a file's input is a tar of it, which may be sparse")
	f.BoolVar(&readHoles, "read-holes", false, "get --sparse: find holes by reading files (where the file system does not say where they are)")
	f.BoolVar(&rec, "recursive", false, "rm: a directory with what it holds")
	f.StringVar(&mode, "mode", "", "put: the file's mode (octal)")
	f.IntVar(&uid, "uid", -1, "put: the file's owner")
	f.IntVar(&gid, "gid", -1, "put: the file's group")
	f.Int64Var(&size, "size", -1, "put: the input's length, when known")
	f.Int64Var(&mtime, "mtime", 0, "put: the file's modification time (Unix nanoseconds)")
	f.IntVar(&limit, "limit", files.DefaultListLimit, "list: at most this many entries")
	return cmd
}
