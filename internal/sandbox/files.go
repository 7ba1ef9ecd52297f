package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/useshards/shard/internal/project"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/files"
	"github.com/useshards/shard/internal/ledger"
	"github.com/useshards/shard/internal/provider"
	"github.com/useshards/shard/internal/rootfs"
	"github.com/useshards/shard/internal/store"
	"github.com/useshards/shard/internal/units"
	"golang.org/x/sys/unix"
)

// Files in and out of a sandbox go through `shard files-helper` (see
// internal/files): inside a running sandbox, an exec of the agent's binary
// as root, so gVisor's Sentry sees every change and the sandbox's own
// kernel resolves every path; for a stopped one, the server's binary on the
// host, chrooted into the sandbox's files mounted for the while. The server
// never opens a path inside a sandbox's files itself.

// Files reads, writes, lists and removes sandboxes' files (this file),
// diffs them (diff.go) and draws the fork tree (tree.go).
type Files struct {
	s     *Service
	diffs *slots // a slot per diff running (Config.MaxDiffs); made by New
}

// agentBinary is where every sandbox has the shard binary (installAgent).
const agentBinary = "/.shard/shard"

// fileHelper is one run of the helper.
type fileHelper struct {
	out  *bufio.Reader  // its stdout
	in   io.WriteCloser // its stdin, framed (files.ChunkWriter); nil without
	kill func()         // asks it to stop (a put removes what it half wrote)
	cut  func()         // closes its stdin with no end: a put writes nothing more
	// abort gives up on it: its pipes closed (a helper blocked writing
	// ends on EPIPE) and a SIGTERM (one blocked in an open ends).
	abort func()
	wait  func() error // waits for its end: nil, or why it failed (its stderr)
	done  func()       // lets go of it (and of a stopped sandbox's files)
}

// helperRunning runs the helper in a running sandbox, through its
// runtime's exec: its stdio are host pipes, the fastest way in and out.
func (f *Files) helperRunning(sb *store.Sandbox, args []string, stdin bool) (*fileHelper, error) {
	ex, ok := f.s.providers[sb.Provider].(provider.Execer)
	if !ok {
		return nil, errdefs.Unsupported("provider %s cannot move files in and out of a running sandbox: stop it first", sb.Provider)
	}
	cmd := ex.ExecCommand(sb.ID, 0, 0, "/", append([]string{agentBinary, files.HelperCommand}, args...))
	return startHelper(cmd, stdin, func() {})
}

// helperExit is nil for a helper that ended well, else why it did not.
func helperExit(code, signal int, msg, stderr string) error {
	if code == 0 && signal == 0 {
		return nil
	}
	why := strings.TrimSpace(stderr)
	if why == "" {
		why = msg
	}
	if why == "" {
		why = "exit status " + strconv.Itoa(code)
		if signal != 0 {
			why = "killed by signal " + strconv.Itoa(signal)
		}
	}
	return errors.New(tail(why, 400))
}

// helperHost runs the helper on the host for a stopped sandbox: its files
// are mounted (the sandbox stays locked meanwhile, so it cannot start) and
// the helper chroots into them.
func (f *Files) helperHost(ctx context.Context, sb *store.Sandbox, unlock func(), args []string, stdin bool) (_ *fileHelper, err error) {
	img, err := f.s.cfg.Images.Get(ctx, sb.ImageDigest)
	if err != nil {
		unlock()
		return nil, fmt.Errorf("image %s of sandbox %s: %w", sb.Image, sb.Name, err)
	}
	dir := filepath.Join(f.s.runDir(sb.ID), "files")
	if err := f.s.cfg.Storage.Mount(ctx, sb.ID, img.Layers, dir); err != nil {
		unlock()
		return nil, err
	}
	release := func() {
		if err := rootfs.Unmount(dir); err != nil {
			f.s.cfg.Log.Warn("files: unmount", "sandbox", sb.ID, "err", err)
		}
		f.s.cfg.Storage.Detach(sb.ID)
		os.Remove(dir)
		unlock()
	}
	cmd := exec.Command(f.s.cfg.AgentBinary, append([]string{files.HelperCommand, "--root", dir}, args...)...)
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	h, err := startHelper(cmd, stdin, release)
	if err != nil {
		release()
		return nil, err
	}
	return h, nil
}

// startHelper starts cmd, the helper, with its stdio on pipes; release
// runs once it has ended and been let go of.
func startHelper(cmd *exec.Cmd, stdin bool, release func()) (*fileHelper, error) {
	var stderr bytes.Buffer
	cmd.Stderr = &limitedBuffer{b: &stderr, max: 64 << 10}
	outR, in, err := helperPipes(cmd, stdin)
	if err != nil {
		return nil, err
	}
	err = cmd.Start()
	// The child has its ends of the pipes now (or never will): the
	// parent's copies of them go.
	cmd.Stdout.(*os.File).Close()
	if stdin {
		cmd.Stdin.(*os.File).Close()
	}
	if err != nil {
		outR.Close()
		if in != nil {
			in.Close()
		}
		return nil, fmt.Errorf("start the files helper: %w", err)
	}
	var waitErr error
	waited := make(chan struct{})
	go func() {
		waitErr = cmd.Wait()
		close(waited)
	}()
	h := &fileHelper{
		out:  bufio.NewReaderSize(outR, 64<<10),
		kill: func() { cmd.Process.Signal(syscall.SIGTERM) },
		cut: func() {
			if in != nil {
				in.Close()
			}
		},
		abort: func() {
			outR.Close()
			if in != nil {
				in.Close()
			}
			cmd.Process.Signal(syscall.SIGTERM)
		},
		wait: func() error {
			<-waited
			if waitErr == nil {
				return nil
			}
			var ee *exec.ExitError
			if errors.As(waitErr, &ee) {
				return helperExit(ee.ExitCode(), 0, "", stderr.String())
			}
			return waitErr
		},
	}
	h.done = helperDone(cmd, in, outR, waited, release)
	if stdin {
		// Chunks are as big as the body's reads; the buffer makes every
		// write into the pipe a full one.
		bw := bufio.NewWriterSize(in, 1<<20)
		h.in = &chunkStdin{ChunkWriter: files.NewChunkWriter(bw), w: bw, c: in}
	}
	return h, nil
}

// helperDone is a helper's end: it lets go of its stdin and stdout, waits
// for it (killing it after 5 s), and then runs release; once.
func helperDone(cmd *exec.Cmd, in, outR *os.File, waited <-chan struct{}, release func()) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			if in != nil {
				in.Close()
			}
			// Our end of its stdout goes first: a helper still writing (a
			// download its client left) gets EPIPE and ends. Killing the
			// host's runtime exec alone leaves the helper in the sandbox,
			// blocked on a pipe nobody reads, and this wait for ever.
			outR.Close()
			select {
			case <-waited:
			case <-time.After(5 * time.Second):
				cmd.Process.Kill()
				<-waited
			}
			release()
		})
	}
}

// helperPipes gives cmd pipes for its stdout and (if stdin) its stdin, and
// returns our ends; the child's ends are cmd.Stdout and cmd.Stdin, which
// the caller closes once the child has started (or failed to).
func helperPipes(cmd *exec.Cmd, stdin bool) (out, in *os.File, err error) {
	// Pipes of our own, not StdinPipe and StdoutPipe: Wait closes those
	// once the helper exits, and a helper that wrote all it had and
	// ended would lose what was still in the pipe.
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	cmd.Stdout = outW
	if stdin {
		inR, inW, err := os.Pipe()
		if err != nil {
			outR.Close()
			outW.Close()
			return nil, nil, err
		}
		cmd.Stdin, in = inR, inW
	}
	// Big pipes: the helper writes (and reads) a megabyte at a time, and
	// from a gVisor sandbox each trip through a 64 KiB pipe is a trip
	// through the Sentry. Measured: a 128 MiB read took 40% less time.
	for _, f := range []*os.File{in, outR} {
		if f != nil {
			if rc, err := f.SyscallConn(); err == nil {
				rc.Control(func(fd uintptr) { unix.FcntlInt(fd, unix.F_SETPIPE_SZ, 1<<20) })
			}
		}
	}
	return outR, in, nil
}

// chunkStdin flushes and closes the pipe once the end chunk is written.
type chunkStdin struct {
	*files.ChunkWriter
	w *bufio.Writer
	c io.Closer
}

func (c *chunkStdin) Close() error {
	err := c.ChunkWriter.Close()
	if err == nil {
		err = c.w.Flush()
	}
	if cerr := c.c.Close(); err == nil {
		err = cerr
	}
	return err
}

type limitedBuffer struct {
	mu  sync.Mutex
	b   *bytes.Buffer
	max int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if room := l.max - l.b.Len(); room > 0 {
		l.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// helper starts the helper for sb as its state allows: inside it when it
// runs, on the host when it is stopped (or failed: its files are there to
// look at), refused while it is changing.
func (f *Files) helper(ctx context.Context, idOrName, verb string, args []string, stdin bool) (*store.Sandbox, *fileHelper, error) {
	sb, err := f.s.cfg.Store.GetSandbox(ctx, idOrName)
	if err != nil {
		return nil, nil, err
	}
	switch sb.State {
	case StateRunning:
		h, err := f.helperRunning(sb, args, stdin)
		return sb, h, err
	case StateStopped, StateFailed:
		sb, unlock, err := f.s.lockSandbox(ctx, sb.ID)
		if err != nil {
			return nil, nil, err
		}
		if sb.State != StateStopped && sb.State != StateFailed {
			unlock()
			return f.helper(ctx, sb.ID, verb, args, stdin)
		}
		h, err := f.helperHost(ctx, sb, unlock, args, stdin)
		return sb, h, err
	case StateFreezing:
		return nil, nil, errdefs.Conflict(client.CodeSandboxFrozen, "sandbox %s: %s", sb.Name, FrozenMessage)
	}
	return nil, nil, errdefs.Conflict(client.CodeSandboxBusy, "sandbox %s is %s: %s its files when that is done", sb.Name, sb.State, verb)
}

// answer reads the helper's Result; a helper that gave none says why (its
// exit), and one that failed is an API error.
func (f *Files) answer(ctx context.Context, sb *store.Sandbox, h *fileHelper) (files.Result, error) {
	// A caller that goes away stops a helper that has not answered (one
	// waiting on a FIFO the sandbox put at the path, say).
	stop := context.AfterFunc(ctx, h.abort)
	defer stop()
	res, err := files.ReadResult(h.out)
	if err != nil {
		// A helper whose answer was refused (over MaxResultLine) is still
		// writing it: it ends only once nobody reads.
		h.abort()
		if werr := h.wait(); werr != nil && errors.Is(err, io.ErrUnexpectedEOF) {
			err = werr
		}
		return res, errdefs.New(errdefs.KindFailed, client.CodeFilesHelperFailed,
			"the file operation in sandbox %s failed: %v (a sandbox started by an older shard may need a stop and start)", sb.Name, err)
	}
	if !res.OK {
		return res, f.fileError(sb, res)
	}
	return res, nil
}

// fileError maps a helper's failure to an API error.
func (f *Files) fileError(sb *store.Sandbox, res files.Result) error {
	msg := res.Message
	switch res.Code {
	case files.CodeNotFound:
		return errdefs.NotFound(res.Code, "sandbox %s: %s", sb.Name, msg)
	case files.CodeInvalid, files.CodeIsDir, files.CodeNotDir, files.CodeNotRegular, files.CodeUnsafe, files.CodeBadArchive, files.CodeShortBody:
		return errdefs.New(errdefs.KindInvalid, res.Code, "sandbox %s: %s", sb.Name, msg)
	case files.CodeNotEmpty, files.CodeReadOnly, files.CodePermission:
		return errdefs.Conflict(res.Code, "sandbox %s: %s", sb.Name, msg)
	case files.CodeDiskFull:
		return errdefs.New(errdefs.KindNoSpace, res.Code, "sandbox %s's disk is full (its bound is %s): %s",
			sb.Name, units.FormatSize(f.s.cfg.Storage.Bound(sb.ID)), msg)
	case files.CodeTooLarge:
		return errdefs.New(errdefs.KindTooLarge, res.Code, "sandbox %s: %s", sb.Name, msg)
	}
	code := files.CodeIO
	if res.Code != code {
		// The helper runs in the sandbox: a code it has no business
		// sending is not passed on.
		code = client.CodeFilesHelperFailed
	}
	return errdefs.New(errdefs.KindFailed, code, "sandbox %s: %s", sb.Name, msg)
}

// StatFile describes a file of a sandbox (what a symlink names, with
// follow, or when path ends in / or /.).
func (f *Files) StatFile(ctx context.Context, idOrName, path string, follow bool) (*files.Info, error) {
	args := []string{files.OpStat, path}
	if follow || files.NamesDir(path) {
		args = append(args, "--follow")
	}
	_, res, err := f.ask(ctx, idOrName, "read", path, args)
	if err != nil {
		return nil, err
	}
	return res.Info, nil
}

// ask runs one helper operation on path that answers its Result and
// nothing more (stat, list, remove), path checked first.
func (f *Files) ask(ctx context.Context, idOrName, verb, path string, args []string) (*store.Sandbox, files.Result, error) {
	if _, err := files.CheckPath(path); err != nil {
		return nil, files.Result{}, pathError(err)
	}
	sb, h, err := f.helper(ctx, idOrName, verb, args, false)
	if err != nil {
		return nil, files.Result{}, err
	}
	defer h.done()
	res, err := f.answer(ctx, sb, h)
	return sb, res, err
}

// pathError is a path the helper would refuse, refused before it runs.
func pathError(err error) error {
	return errdefs.New(errdefs.KindInvalid, files.CodeInvalid, "%v", err)
}

// ListFiles describes the entries of a sandbox's directory (at most limit;
// truncated says there were more).
func (f *Files) ListFiles(ctx context.Context, idOrName, path string, limit int) (entries []files.Info, truncated bool, err error) {
	if limit <= 0 || limit > files.DefaultListLimit {
		limit = files.DefaultListLimit
	}
	_, res, err := f.ask(ctx, idOrName, "read", path, []string{files.OpList, path, "--limit", strconv.Itoa(limit)})
	if err != nil {
		return nil, false, err
	}
	if res.Entries == nil {
		res.Entries = []files.Info{}
	}
	return res.Entries, res.Truncated, nil
}

// FileStream is a read of a sandbox's files: Info says what is read, then
// Read gives its bytes (a file's, or a tar). A read that fails once its
// bytes began returns that error, never a clean end. Close lets go of it.
type FileStream struct {
	Info files.Info
	sb   *store.Sandbox
	h    *fileHelper
	err  error
	stop func() bool // unregisters the abort on its caller's end (ReadFiles)
}

func (f *FileStream) Read(p []byte) (int, error) {
	if f.err != nil {
		return 0, f.err
	}
	n, err := f.h.out.Read(p)
	if err == io.EOF {
		if werr := f.h.wait(); werr != nil {
			err = fmt.Errorf("reading the files of sandbox %s failed: %w", f.sb.Name, werr)
		}
	}
	if err != nil {
		f.err = err
	}
	return n, err
}

// Close ends the read (the helper stops if it has not finished).
func (f *FileStream) Close() error {
	f.stop()
	f.h.kill()
	f.h.done()
	return nil
}

// ReadFiles starts a read of path in a sandbox: the file's bytes, or with
// o.Tar a tar of it (a directory with what it holds). With o.Follow, or a
// path that ends in / or /., a symlink at path is read as what it names
// (resolved in the sandbox, as every path is). o.Sparse sends a tar's
// files that have holes as their data (files.TarOptions), when the
// sandbox's helper can (takesSparse); else they are sent whole.
func (f *Files) ReadFiles(ctx context.Context, idOrName, path string, o files.GetOptions) (*FileStream, error) {
	if _, err := files.CheckPath(path); err != nil {
		return nil, pathError(err)
	}
	args := []string{files.OpGet, path}
	if o.Tar {
		args = append(args, "--tar")
	}
	if o.Follow || files.NamesDir(path) {
		args = append(args, "--follow")
	}
	if o.Sparse && o.Tar {
		extra, err := f.sparseArgs(ctx, idOrName)
		if err != nil {
			return nil, err
		}
		args = append(args, extra...)
	}
	sb, h, err := f.helper(ctx, idOrName, "read", args, false)
	if err != nil {
		return nil, err
	}
	res, err := f.answer(ctx, sb, h)
	if err != nil {
		h.done()
		return nil, err
	}
	if res.Info == nil {
		h.done()
		return nil, errdefs.New(errdefs.KindFailed, client.CodeFilesHelperFailed, "the file operation in sandbox %s gave no description of %s", sb.Name, path)
	}
	// A caller that goes away ends the read at once: a helper that finds a
	// huge file's holes writes nothing for minutes, so no failed write
	// would tell the caller's copy, blocked on the pipe, that it is gone;
	// and the closed pipe is how the helper learns it (files.WatchOutput).
	return &FileStream{Info: *res.Info, sb: sb, h: h, stop: context.AfterFunc(ctx, h.abort)}, nil
}

// sparseArgs are the helper's arguments of a read of sparse files: none
// for a helper that cannot (takesSparse), and holes found by reading in a
// running sandbox whose files do not show them (provider.HoleHider).
func (f *Files) sparseArgs(ctx context.Context, idOrName string) ([]string, error) {
	sb, err := f.s.cfg.Store.GetSandbox(ctx, idOrName)
	if err != nil || !f.takesSparse(sb) {
		return nil, err
	}
	if hh, ok := f.s.providers[sb.Provider].(provider.HoleHider); ok && hh.HidesHoles() && sb.State == StateRunning {
		return []string{"--sparse", "--read-holes"}, nil
	}
	return []string{"--sparse"}, nil
}

// takesSparse reports whether the files helper of sb takes --sparse: the
// host's (a stopped sandbox's) and that of a sandbox this build started
// do; that of one an older shard started and that still runs may not, and
// would write a sparse entry's data as a whole file. (A sandbox that
// starts meanwhile gets this build's.)
func (f *Files) takesSparse(sb *store.Sandbox) bool {
	return sb.State != StateRunning || sb.AgentDir == "" || sb.AgentDir == f.s.agentDir
}

// WriteOptions say how WriteFiles writes.
type WriteOptions struct {
	Tar     bool      // body is a tar to unpack into the directory path
	Mode    int64     // -1: the replaced file's, or 0644
	UID     int       // -1: the replaced file's, or root
	GID     int       // -1 as UID
	MTime   time.Time // zero: now
	Size    int64     // the body's length when known, else -1
	Parents bool      // make a file's missing parent directories
	// Sparse: the body may hold sparse entries (files.PutOptions.Sparse:
	// a file's body is then a tar of it).
	Sparse bool
}

// WriteResult is what a write did.
type WriteResult struct {
	Path  string   `json:"path"`
	Bytes int64    `json:"bytes"`
	Files int      `json:"files"`
	Notes []string `json:"notes,omitempty"`
}

// WriteFiles writes body at path in a sandbox: one file, replaced whole
// (nothing is written unless all of body arrives), or a tar unpacked into
// the directory path. The write is in the sandbox's ledger.
func (f *Files) WriteFiles(ctx context.Context, idOrName, path string, body io.Reader, o WriteOptions) (*WriteResult, error) {
	clean, err := files.CheckPath(path)
	if err != nil {
		return nil, pathError(err)
	}
	if o.Mode > 0o7777 {
		return nil, errdefs.Invalid("mode %o: at most 7777", o.Mode)
	}
	if err := f.s.adm.ledgerRoom(ctx, project.Of(ctx), "write files into sandbox "+idOrName); err != nil {
		return nil, err
	}
	if o.Sparse {
		sb, err := f.s.cfg.Store.GetSandbox(ctx, idOrName)
		if err != nil {
			return nil, err
		}
		if !f.takesSparse(sb) {
			return nil, errdefs.Unsupported("sandbox %s runs the files helper of an older shard, which cannot write sparse files: send them whole, or stop and start the sandbox to give it this server's", sb.Name)
		}
	}
	args := []string{files.OpPut, path, "--uid", strconv.Itoa(o.UID), "--gid", strconv.Itoa(o.GID), "--size", strconv.FormatInt(o.Size, 10)}
	if o.Tar {
		args = append(args, "--tar")
	}
	if o.Mode >= 0 {
		args = append(args, "--mode", strconv.FormatInt(o.Mode, 8))
	}
	if !o.MTime.IsZero() {
		args = append(args, "--mtime", strconv.FormatInt(o.MTime.UnixNano(), 10))
	}
	if o.Parents {
		args = append(args, "--parents")
	}
	if o.Sparse {
		args = append(args, "--sparse")
	}
	sb, h, err := f.helper(ctx, idOrName, "write", args, true)
	if err != nil {
		return nil, err
	}
	defer h.done()
	sent := make(chan error, 1)
	go func() {
		_, err := io.CopyBuffer(h.in, body, make([]byte, 1<<20))
		if err == nil {
			err = h.in.Close()
		} else {
			// The body broke off (or stalled past the body timeout): its
			// stdin ends with no end chunk, which the helper takes for a
			// cut upload, and it writes nothing more.
			h.cut()
			h.kill()
		}
		sent <- err
	}()
	res, err := f.answer(ctx, sb, h)
	if err != nil {
		// It refused, or stopped, before all was sent: letting go of it
		// ends the send.
		h.done()
	}
	serr := <-sent
	// A body that broke off (stalled past the body timeout, whose cut
	// also ends ctx) is why the helper, cut and stopped, said nothing or
	// that its upload was cut: the client is told that, not of the helper.
	if serr != nil && !errors.Is(serr, os.ErrClosed) && !errors.Is(serr, syscall.EPIPE) &&
		(err == nil || errdefs.CodeOf(err) == files.CodeShortBody || errdefs.CodeOf(err) == client.CodeFilesHelperFailed) {
		return nil, errdefs.New(errdefs.KindInvalid, files.CodeShortBody,
			"the upload to sandbox %s broke off (%v): %s", sb.Name, serr, "nothing of a file that was not whole was written")
	}
	if err != nil {
		f.fileEvent(ctx, sb, ledger.FilesWritten, ledger.FilesData{Path: clean, Tar: o.Tar, Bytes: res.Bytes, Files: res.Files, Error: errdefs.CodeOf(err)}, res.Files > 0)
		return nil, err
	}
	f.fileEvent(ctx, sb, ledger.FilesWritten, ledger.FilesData{Path: clean, Tar: o.Tar, Bytes: res.Bytes, Files: res.Files}, true)
	return &WriteResult{Path: clean, Bytes: res.Bytes, Files: res.Files, Notes: res.Notes}, nil
}

// fileEvent puts a change of a sandbox's files in its ledger (when it
// changed anything).
func (f *Files) fileEvent(ctx context.Context, sb *store.Sandbox, typ string, d ledger.FilesData, changed bool) {
	if !changed {
		return
	}
	if err := f.s.cfg.Store.AddEvent(context.WithoutCancel(ctx), sb, &store.EventSpec{Type: typ, Data: d}); err != nil {
		f.s.cfg.Log.Warn("ledger: file event", "sandbox", sb.ID, "type", typ, "err", err)
	}
}

// RemoveFile removes path in a sandbox (a directory that holds anything
// only with recursive). The removal is in the sandbox's ledger.
func (f *Files) RemoveFile(ctx context.Context, idOrName, path string, recursive bool) (*files.Info, error) {
	args := []string{files.OpRemove, path}
	if recursive {
		args = append(args, "--recursive")
	}
	sb, res, err := f.ask(ctx, idOrName, "remove", path, args)
	if err != nil {
		return nil, err
	}
	clean, _ := files.CheckPath(path)
	f.fileEvent(ctx, sb, ledger.FilesRemoved, ledger.FilesData{Path: clean, Recursive: recursive}, true)
	return res.Info, nil
}
