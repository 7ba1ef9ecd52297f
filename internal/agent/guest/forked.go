package guest

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/useshards/shard/internal/agent/proto"

	"github.com/useshards/shard/internal/envlist"
)

// writeIdentity writes id to ForkFile, atomically.
func writeIdentity(id proto.Identity) error {
	b, err := json.Marshal(id)
	if err != nil {
		return err
	}
	return replaceFile(proto.ForkFile, append(b, '\n'), 0o644, true)
}

// replaceFile writes data to path by a rename of a file written beside it,
// making the directory when mkdir; the file keeps the mode of the one it
// replaces, if any.
func replaceFile(path string, data []byte, mode os.FileMode, mkdir bool) error {
	dir := filepath.Dir(path)
	if mkdir {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	if fi, err := os.Lstat(path); err == nil && fi.Mode().IsRegular() {
		mode = fi.Mode().Perm()
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// newMachineID gives the sandbox a new /etc/machine-id if its image has
// one (a regular file: a symlink is left alone), as systemd-machine-id-setup
// writes it: 32 hex digits and a newline.
func newMachineID() error {
	const path = "/etc/machine-id"
	fi, err := os.Lstat(path)
	if err != nil || !fi.Mode().IsRegular() {
		return nil
	}
	var b [16]byte
	rand.Read(b[:])
	// A version 4 UUID's bits, as systemd makes them.
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return replaceFile(path, []byte(hex.EncodeToString(b[:])+"\n"), 0o444, false)
}

// forked carries out OpForked.
func (s *Server) forked(f *proto.Forked) proto.Reply {
	r := proto.Reply{OK: true}
	if f.Role == proto.RoleFork {
		// What the sandbox did to these files is its own business: a
		// machine-id or fork file it made unwritable (a directory in its
		// place) is said in the answer, and the hooks run all the same.
		if err := newMachineID(); err != nil {
			r.Error = "a new machine-id: " + err.Error()
		}
		if err := writeIdentity(f.Identity); err != nil {
			r.Error = "write " + proto.ForkFile + ": " + err.Error()
		}
	}
	if f.Hooks {
		r.Hooks = s.runHooks(f)
	}
	return r
}

// hookNames lists HooksDir's hooks in the order they run: the regular
// files with an execute bit, by name, as run-parts takes them (names of
// letters, digits, _ and -; others, such as editor backups, are skipped).
func hookNames() ([]string, error) {
	ents, err := os.ReadDir(proto.HooksDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if !runPartsName(e.Name()) {
			continue
		}
		fi, err := os.Stat(filepath.Join(proto.HooksDir, e.Name()))
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			continue
		}
		out = append(out, e.Name())
	}
	slices.Sort(out)
	return out, nil
}

func runPartsName(n string) bool {
	for _, c := range n {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return n != ""
}

// runHooks runs the hooks one after another, each within the timeout, and
// stops at the first that fails unless told to keep going.
func (s *Server) runHooks(f *proto.Forked) []proto.HookResult {
	names, err := hookNames()
	if err != nil {
		return []proto.HookResult{{Hook: proto.HooksDir, Error: err.Error(), ExitCode: -1}}
	}
	if len(names) > proto.MaxHooks {
		return []proto.HookResult{{Hook: proto.HooksDir, Error: fmt.Sprintf("%d hooks: at most %d run", len(names), proto.MaxHooks), ExitCode: -1}}
	}
	timeout := time.Duration(f.HookTimeoutMS) * time.Millisecond
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	id := f.Identity
	env := envlist.Merge(s.baseEnv, []string{
		"SHARD_FORK_ROLE=" + f.Role,
		"SHARD_FORK_ID=" + id.ID,
		"SHARD_FORK_NAME=" + id.Name,
		"SHARD_FORK_PARENT_ID=" + id.ParentID,
		"SHARD_FORK_PARENT_NAME=" + id.ParentName,
		"SHARD_FORK_CHECKPOINT=" + id.Checkpoint,
		"SHARD_FORK_GENERATION=" + strconv.Itoa(id.Generation),
	})
	var out []proto.HookResult
	for _, n := range names {
		r := s.runHook(filepath.Join(proto.HooksDir, n), env, timeout)
		r.Hook = n
		out = append(out, r)
		if r.Failed() && !f.KeepGoing {
			break
		}
	}
	return out
}

// runHook runs one hook as root in /, stdin empty, stdout and stderr into
// one pipe, in a process group of its own that a timeout kills whole.
func (s *Server) runHook(path string, env []string, timeout time.Duration) proto.HookResult {
	start := time.Now()
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return proto.HookResult{ExitCode: -1, Error: err.Error()}
	}
	defer devnull.Close()
	pr, pw, err := os.Pipe()
	if err != nil {
		return proto.HookResult{ExitCode: -1, Error: err.Error()}
	}
	done := make(chan syscall.WaitStatus, 1)
	attr := &os.ProcAttr{Dir: "/", Env: env, Files: []*os.File{devnull, pw, pw}, Sys: &syscall.SysProcAttr{Setpgid: true}}
	pid, err := s.reaper.start(path, []string{path}, attr, done)
	pw.Close()
	if err != nil {
		pr.Close()
		return proto.HookResult{ExitCode: -1, Error: fmt.Sprintf("start %s: %v", path, errors.Unwrap(err)), DurationMS: time.Since(start).Milliseconds()}
	}
	output := make(chan string, 1)
	go func() {
		output <- keepTail(pr, proto.MaxHookOutput)
		pr.Close()
	}()
	var r proto.HookResult
	var ws syscall.WaitStatus
	select {
	case ws = <-done:
	case <-time.After(timeout):
		syscall.Kill(-pid, syscall.SIGKILL)
		ws = <-done
		r.TimedOut = true
	}
	// What it left behind holding the pipe is not waited for long.
	select {
	case r.Output = <-output:
	case <-time.After(time.Second):
		syscall.Kill(-pid, syscall.SIGKILL)
		pr.Close()
		r.Output = <-output
	}
	r.DurationMS = time.Since(start).Milliseconds()
	switch {
	case ws.Exited():
		r.ExitCode = ws.ExitStatus()
	case ws.Signaled():
		r.Signal = int(ws.Signal())
		r.ExitCode = 128 + r.Signal
	}
	return r
}

// keepTail reads r to its end and returns at most its last max bytes.
func keepTail(r io.Reader, max int) string {
	buf := make([]byte, 0, max)
	chunk := make([]byte, 32<<10)
	cut := false
	for {
		n, err := r.Read(chunk)
		buf = append(buf, chunk[:n]...)
		if len(buf) > max {
			buf = append(buf[:0], buf[len(buf)-max:]...)
			cut = true
		}
		if err != nil {
			break
		}
	}
	s := strings.ToValidUTF8(string(buf), "\uFFFD")
	if cut {
		s = "[...]" + s
	}
	return s
}
