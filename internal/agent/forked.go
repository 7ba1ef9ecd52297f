package agent

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

	"github.com/useshards/shard/internal/envlist"
)

// The fork contract: what a sandbox learns of its own identity, and what
// changes when it is forked (or restored: a restore is a fork of the
// checkpoint's instant). See the README's "Forks that know they were
// forked".

// Identity is who a sandbox is, as /run/shard/fork says it.
type Identity struct {
	ID         string    `json:"id"`
	Name       string    `json:"name"`
	ParentID   string    `json:"parent_id,omitempty"`
	ParentName string    `json:"parent_name,omitempty"`
	Checkpoint string    `json:"checkpoint,omitempty"` // the checkpoint it started from
	Generation int       `json:"generation"`           // forks between it and the sandbox its lineage began with
	ForkedAt   time.Time `json:"forked_at,omitzero"`   // when it was made from its parent
}

// EnvIdentity carries the sandbox's Identity (JSON) to the agent at boot.
const EnvIdentity = "SHARD_AGENT_IDENTITY"

// ForkFile is where a sandbox reads its Identity; the agent replaces it
// (a rename into /run/shard, which inotify sees) when the sandbox is forked.
const ForkFile = "/run/shard/fork"

// HooksDir holds the executables a fork runs right after it resumes.
const HooksDir = "/etc/shard/on-fork.d"

// Roles of a hook run (Forked.Role).
const (
	RoleFork   = "fork"
	RoleSource = "source"
)

// Forked is OpForked's request: the new identity of a fork (Role fork),
// or, for the source of a fork (Role source), the fork's, and whether and
// how to run the hooks.
type Forked struct {
	Role          string   `json:"role"`
	Identity      Identity `json:"identity"`
	Hooks         bool     `json:"hooks"`
	HookTimeoutMS int64    `json:"hook_timeout_ms"`
	// KeepGoing runs every hook even after one failed (errors ignored).
	KeepGoing bool `json:"keep_going,omitempty"`
}

// HookResult is one hook's run.
type HookResult struct {
	Hook       string `json:"hook"`
	ExitCode   int    `json:"exit_code"`
	Signal     int    `json:"signal,omitempty"`
	TimedOut   bool   `json:"timed_out,omitempty"`
	Error      string `json:"error,omitempty"` // it could not start
	DurationMS int64  `json:"duration_ms"`
	Output     string `json:"output,omitempty"` // stdout and stderr, at most MaxHookOutput bytes (its end)
}

// Failed reports a hook that did not exit 0.
func (h HookResult) Failed() bool {
	return h.ExitCode != 0 || h.Signal != 0 || h.TimedOut || h.Error != ""
}

// MaxHookOutput bounds the output of a hook that is kept.
const MaxHookOutput = 16 << 10

// MaxHooks bounds how many hooks run.
const MaxHooks = 64

// writeIdentity writes id to ForkFile, atomically.
func writeIdentity(id Identity) error {
	b, err := json.Marshal(id)
	if err != nil {
		return err
	}
	return replaceFile(ForkFile, append(b, '\n'), 0o644, true)
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
func (s *Server) forked(f *Forked) Reply {
	r := Reply{OK: true}
	if f.Role == RoleFork {
		// What the sandbox did to these files is its own business: a
		// machine-id or fork file it made unwritable (a directory in its
		// place) is said in the answer, and the hooks run all the same.
		if err := newMachineID(); err != nil {
			r.Error = "a new machine-id: " + err.Error()
		}
		if err := writeIdentity(f.Identity); err != nil {
			r.Error = "write " + ForkFile + ": " + err.Error()
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
	ents, err := os.ReadDir(HooksDir)
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
		fi, err := os.Stat(filepath.Join(HooksDir, e.Name()))
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
func (s *Server) runHooks(f *Forked) []HookResult {
	names, err := hookNames()
	if err != nil {
		return []HookResult{{Hook: HooksDir, Error: err.Error(), ExitCode: -1}}
	}
	if len(names) > MaxHooks {
		return []HookResult{{Hook: HooksDir, Error: fmt.Sprintf("%d hooks: at most %d run", len(names), MaxHooks), ExitCode: -1}}
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
	var out []HookResult
	for _, n := range names {
		r := s.runHook(filepath.Join(HooksDir, n), env, timeout)
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
func (s *Server) runHook(path string, env []string, timeout time.Duration) HookResult {
	start := time.Now()
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return HookResult{ExitCode: -1, Error: err.Error()}
	}
	defer devnull.Close()
	pr, pw, err := os.Pipe()
	if err != nil {
		return HookResult{ExitCode: -1, Error: err.Error()}
	}
	done := make(chan syscall.WaitStatus, 1)
	attr := &os.ProcAttr{Dir: "/", Env: env, Files: []*os.File{devnull, pw, pw}, Sys: &syscall.SysProcAttr{Setpgid: true}}
	pid, err := s.reaper.start(path, []string{path}, attr, done)
	pw.Close()
	if err != nil {
		pr.Close()
		return HookResult{ExitCode: -1, Error: fmt.Sprintf("start %s: %v", path, errors.Unwrap(err)), DurationMS: time.Since(start).Milliseconds()}
	}
	output := make(chan string, 1)
	go func() {
		output <- keepTail(pr, MaxHookOutput)
		pr.Close()
	}()
	var r HookResult
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
