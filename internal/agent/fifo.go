package agent

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// An exec's stdio as host FIFOs (docs/exec-stream.md).
//
// Why: inside gVisor every write to a pipe between two of the sandbox's
// processes wakes the other through the Sentry. A command writing 4 KiB at
// a time into the agent's pipe moved 100 MiB in 9-13 s; into a host FIFO,
// which the Sentry writes with one host syscall, in about 3 s, as fast as
// `runsc exec`. So the host makes FIFOs on the sandbox's root filesystem
// (a host directory; runsc runs with --host-fifo=open), the agent gives
// them to the command as its stdin, stdout and stderr, and the host reads
// and writes them itself: the agent's connection carries only the start,
// the exit, signals and resizes.
//
// Two things of gVisor's shape this. A FIFO made inside the sandbox is the
// Sentry's own, not a host FIFO: so the host makes them. And the Sentry
// takes a directory it listed as complete: a FIFO the host makes in it
// afterwards stays unseen inside. So the agent makes IODir itself at its
// start (a directory it made is not complete) and never lists it; when
// something in the sandbox did list it, the agent cannot open the FIFOs,
// the exec's output goes through the agent's pipes instead, and the agent
// makes the directory anew once that exec is over.

// IODir is where the FIFOs live, inside the sandbox's root. It is on the
// sandbox's own filesystem (not a mount of its own, which would change the
// runtime spec that checkpoints are restored with), so a fork or a
// checkpoint that carries a command holding one carries the FIFO too, and
// the restored command finds it at the same path.
const IODir = "/.shard-io"

// CapDirectIO: the agent gave the command the FIFOs of Request.IO; its
// output does not come on the connection.
const CapDirectIO = "direct_io"

// DirectIO names an exec's FIFOs inside the sandbox.
type DirectIO struct {
	Stdin  string `json:"stdin,omitempty"` // "" when the command has no stdin
	Stdout string `json:"stdout"`
	Stderr string `json:"stderr"`
}

// Agent side.

// directIO is what the agent holds of an exec's FIFOs: the read end of each
// output, so that a writer never meets a FIFO without a reader (no SIGPIPE
// while the host is away, or in a fork whose host end is gone), drained
// once the host lets go.
type directIO struct {
	paths  []string
	drains []*os.File
	once   sync.Once
}

// openDirect opens the request's FIFOs, if it names any.
func (s *Server) openDirect(req *Request) ([3]*os.File, *directIO, error) {
	if req.IO == nil {
		return [3]*os.File{}, nil, errors.New("no FIFOs")
	}
	if req.Stdin != (req.IO.Stdin != "") {
		return [3]*os.File{}, nil, errors.New("stdin and its FIFO disagree")
	}
	files, dio, err := openDirect(req.IO)
	if errors.Is(err, os.ErrNotExist) {
		s.renewIO.Store(true) // listed inside: see renewIODir
	}
	return files, dio, err
}

// openDirect opens d's FIFOs: the command's fds 0, 1 and 2 (fd 0 nil when
// it has no stdin), blocking as a pipe's are, and what the agent holds.
func openDirect(d *DirectIO) (files [3]*os.File, dio *directIO, err error) {
	dio = &directIO{}
	var opened []*os.File
	fail := func(e error) ([3]*os.File, *directIO, error) {
		for _, f := range opened {
			f.Close()
		}
		return [3]*os.File{}, nil, e
	}
	open := func(p string, flag int) (*os.File, error) {
		if !inIODir(p) {
			return nil, fmt.Errorf("%s is not in %s", p, IODir)
		}
		fd, err := unix.Open(p, flag|unix.O_NONBLOCK|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, &os.PathError{Op: "open", Path: p, Err: err}
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
			unix.Close(fd)
			return nil, fmt.Errorf("%s is not a FIFO", p)
		}
		f := os.NewFile(uintptr(fd), p)
		opened = append(opened, f)
		return f, nil
	}
	blocking := func(f *os.File) error { return unix.SetNonblock(int(f.Fd()), false) }
	if d.Stdin != "" {
		// The host holds a write end already: no EOF before it lets go.
		r, err := open(d.Stdin, unix.O_RDONLY)
		if err != nil {
			return fail(err)
		}
		if err := blocking(r); err != nil {
			return fail(err)
		}
		files[0] = r
		dio.paths = append(dio.paths, d.Stdin)
	}
	for i, p := range []string{d.Stdout, d.Stderr} {
		// The read end first: then the write end opens without waiting.
		r, err := open(p, unix.O_RDONLY)
		if err != nil {
			return fail(err)
		}
		w, err := open(p, unix.O_WRONLY)
		if err != nil {
			return fail(err)
		}
		if err := blocking(w); err != nil {
			return fail(err)
		}
		files[i+1] = w
		dio.drains = append(dio.drains, r)
		dio.paths = append(dio.paths, p)
	}
	return files, dio, nil
}

func inIODir(p string) bool {
	return path.Clean(p) == p && path.Dir(p) == IODir
}

// drain reads and drops what is left in the outputs until every writer is
// gone, then removes the FIFOs: the host let go of them.
func (d *directIO) drain() {
	d.once.Do(func() {
		var wg sync.WaitGroup
		for _, f := range d.drains {
			wg.Add(1)
			go func() {
				defer wg.Done()
				io.Copy(io.Discard, f)
				f.Close()
			}()
		}
		go func() {
			wg.Wait()
			for _, p := range d.paths {
				os.Remove(p)
			}
		}()
	})
}

// setupIODir makes IODir afresh at the agent's start: the FIFOs of execs of
// an earlier run of the sandbox (a stop while they ran) go, and the Sentry
// sees a directory it made, not one it listed.
func setupIODir() {
	os.RemoveAll(IODir)
	os.Mkdir(IODir, 0o700)
}

// renewIODir makes IODir anew after something in the sandbox listed it (an
// exec could not open its FIFOs), once no exec's FIFOs are left in it, so
// that it can be removed; until then it is tried again after each exec.
func (s *Server) renewIODir() {
	if !s.renewIO.Load() {
		return
	}
	if os.Remove(IODir) == nil && os.Mkdir(IODir, 0o700) == nil {
		s.renewIO.Store(false)
	}
}

// Host side.

// HostIO is the host's side of an exec's FIFOs.
type HostIO struct {
	dir   int // O_PATH descriptor of the sandbox's IODir
	id    string
	names []string
	in    *os.File // stdin's write end: O_RDWR until the command holds the read end
	out   [2]*os.File
}

// MakeHostIO makes an exec's FIFOs in the sandbox whose root is rootfs, in
// the IODir its agent made. Everything under rootfs is the sandbox's to
// change (a root process in it may put a symlink where the FIFOs go): every
// step resolves inside rootfs and follows no symlink, and what is opened
// must be a FIFO.
func MakeHostIO(rootfs string, stdin bool) (h *HostIO, err error) {
	root, err := unix.Open(rootfs, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(root)
	how := &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV}
	dir, err := unix.Openat2(root, IODir[1:], how)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", IODir, err) // an older agent, or the sandbox removed it
	}
	var b [8]byte
	rand.Read(b[:])
	h = &HostIO{dir: dir, id: hex.EncodeToString(b[:])}
	defer func() {
		if err != nil {
			h.Close()
		}
	}()
	open := func(suffix string, flag int) (*os.File, error) {
		n := h.id + suffix
		if err := unix.Mkfifoat(dir, n, 0o600); err != nil {
			return nil, fmt.Errorf("mkfifo %s: %w", n, err)
		}
		h.names = append(h.names, n)
		return openFIFO(dir, n, flag)
	}
	// Each is opened for reading and writing at first: in gVisor an open of
	// a host FIFO waits for the other end whatever its flags, so the
	// agent's opens need the host at both ends. Once the command holds its
	// ends, each becomes one-way (started).
	if stdin {
		if h.in, err = open(".0", unix.O_RDWR); err != nil {
			return nil, err
		}
	}
	for i, s := range []string{".1", ".2"} {
		if h.out[i], err = open(s, unix.O_RDWR); err != nil {
			return nil, err
		}
	}
	return h, nil
}

func openFIFO(dir int, name string, flag int) (*os.File, error) {
	how := &unix.OpenHow{Flags: uint64(flag | unix.O_NONBLOCK | unix.O_CLOEXEC),
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV}
	fd, err := unix.Openat2(dir, name, how)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", name, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
		unix.Close(fd)
		return nil, fmt.Errorf("%s is not a FIFO", name)
	}
	// Fewer, larger reads and writes than the default 64 KiB allows.
	unix.FcntlInt(uintptr(fd), unix.F_SETPIPE_SZ, 1<<20)
	return os.NewFile(uintptr(fd), name), nil // non-blocking: Go's poller, with deadlines
}

// Paths names the FIFOs inside the sandbox, for Request.IO.
func (h *HostIO) Paths() *DirectIO {
	d := &DirectIO{Stdout: path.Join(IODir, h.id+".1"), Stderr: path.Join(IODir, h.id+".2")}
	if h.in != nil {
		d.Stdin = path.Join(IODir, h.id+".0")
	}
	return d
}

// started: the command holds its ends, so the host's become one-way: a
// read of an output ends (EOF) once the command and its children closed
// it, and a write of stdin fails once the command is gone, as on pipes.
func (h *HostIO) started() error {
	swap := func(f **os.File, suffix string, flag int) error {
		nf, err := openFIFO(h.dir, h.id+suffix, flag)
		if err != nil {
			return err
		}
		(*f).Close()
		*f = nf
		return nil
	}
	if h.in != nil {
		if err := swap(&h.in, ".0", unix.O_WRONLY); err != nil {
			return err
		}
	}
	for i, s := range []string{".1", ".2"} {
		if err := swap(&h.out[i], s, unix.O_RDONLY); err != nil {
			return err
		}
	}
	return nil
}

// Close closes the host's ends and removes the FIFOs (a command still
// holding one keeps it, and the agent drains it).
func (h *HostIO) Close() {
	if h.in != nil {
		h.in.Close()
	}
	for _, f := range h.out {
		if f != nil {
			f.Close()
		}
	}
	for _, n := range h.names {
		unix.Unlinkat(h.dir, n, 0)
	}
	h.names = nil
	if h.dir >= 0 {
		unix.Close(h.dir)
		h.dir = -1
	}
}

// Reading the outputs after the command's exit: a background child may
// hold them open for ever. Output keeps coming while it comes within
// tailQuiet of the last, for at most tailMost of reading (the time spent
// handing it on to a slow client does not count, so no output written
// before the exit is lost to a slow client).
const (
	tailQuiet = 100 * time.Millisecond
	tailMost  = time.Second
)
