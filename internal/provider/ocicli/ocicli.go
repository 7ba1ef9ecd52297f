// Package ocicli runs an OCI runtime's command line (runsc, runc): the
// common part of the gvisor and runc providers. It never touches HTTP.
package ocicli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/useshards/shard/internal/kmutex"
	"github.com/useshards/shard/internal/oci"
	"github.com/useshards/shard/internal/provider"
)

// CLI is one runtime binary with the global flags every call must repeat.
type CLI struct {
	Binary string
	Global []string // e.g. --root DIR, --platform systrap

	ids idLocks // state, kill and delete of one container, one at a time
}

// idLocks serialises the calls that name one container. runsc's state (or
// kill) of a container being deleted meanwhile finds its state file, then
// takes its lock (flock, creating the lock file) after the delete removed
// both, and leaves a lock file behind for ever: seen when a sandbox was
// removed while the watcher still asked for its pid.
type idLocks struct{ k kmutex.Keyed }

// lock holds id's lock until the returned func is called.
func (l *idLocks) lock(id string) func() { return l.k.Lock(id) }

// runID is Run of a call about container id, serialised with the others
// about it (see idLocks).
func (c *CLI) runID(ctx context.Context, id string, args ...string) ([]byte, error) {
	defer c.ids.lock(id)()
	return c.Run(ctx, args...)
}

// Run runs the runtime with args and returns its stdout; stderr goes into
// the error.
func (c *CLI) Run(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, c.Binary, append(append([]string(nil), c.Global...), args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// The runtime's helpers (runsc's sandbox and gofer) must outlive the
	// server: they get their own session, away from our signals.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = strings.TrimSpace(stdout.String())
		}
		return stdout.Bytes(), fmt.Errorf("%s %s: %w: %s", filepath.Base(c.Binary), args[0], killedBy(ctx, err), lastLines(msg, 6))
	}
	return stdout.Bytes(), nil
}

// killedBy is err, or ctx's error when ctx's end killed the runtime: the
// caller left (499) or its deadline passed (504), which a "signal: killed"
// would hide as the server's fault.
func killedBy(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return fmt.Errorf("%w (%v)", cerr, err)
	}
	return err
}

func lastLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// WriteBundle writes inst.Spec as config.json in the bundle.
func WriteBundle(inst *provider.Instance, spec *specs.Spec) error {
	if err := os.MkdirAll(inst.Bundle, 0o700); err != nil {
		return err
	}
	b, err := json.MarshalIndent(spec, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(inst.Bundle, "config.json"), b, 0o600)
}

// RunDetachedFiles runs `run --detach` (or create, restore), with extra
// files for the runtime as descriptors 3 and on (runc passes them on with
// --preserve-fds). The container process inherits the runtime's stdio, so
// both go to inst.LogOut, never to a pipe: a pipe held open by the
// container would keep us waiting for ever. The runtime's own error is
// read back from the log's tail.
func (c *CLI) RunDetachedFiles(ctx context.Context, inst *provider.Instance, extra []*os.File, args ...string) error {
	out, err := os.OpenFile(inst.LogOut, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	start, _ := out.Seek(0, io.SeekEnd)
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return err
	}
	defer devnull.Close()
	cmd := exec.CommandContext(ctx, c.Binary, append(append([]string(nil), c.Global...), args...)...)
	cmd.Stdin = devnull
	cmd.Stdout = out
	cmd.Stderr = out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.ExtraFiles = extra
	if err := cmd.Run(); err != nil {
		msg := ""
		if f, ferr := os.Open(inst.LogOut); ferr == nil {
			f.Seek(start, io.SeekStart)
			b, _ := io.ReadAll(io.LimitReader(f, 64<<10))
			f.Close()
			msg = strings.TrimSpace(string(b))
		}
		return fmt.Errorf("%s %s: %w: %s", filepath.Base(c.Binary), args[0], killedBy(ctx, err), lastLines(msg, 6))
	}
	return nil
}

type state struct {
	ID     string `json:"id"`
	Status string `json:"status"`
	Pid    int    `json:"pid"`
}

// Status asks `state ID`.
func (c *CLI) Status(ctx context.Context, id string) (provider.Status, error) {
	out, err := c.runID(ctx, id, "state", id)
	if err != nil {
		if c.absent(ctx, id) {
			return provider.StatusAbsent, nil
		}
		return "", err
	}
	var st state
	if err := json.Unmarshal(out, &st); err != nil {
		return "", fmt.Errorf("state %s: %w", id, err)
	}
	switch st.Status {
	case "running", "created":
		return provider.StatusRunning, nil
	case "paused":
		return provider.StatusPaused, nil
	default:
		return provider.StatusStopped, nil
	}
}

// List asks `list --format json`.
func (c *CLI) List(ctx context.Context) ([]string, error) {
	out, err := c.Run(ctx, "list", "--format", "json")
	if err != nil {
		return nil, err
	}
	var sts []state
	if len(bytes.TrimSpace(out)) == 0 || bytes.Equal(bytes.TrimSpace(out), []byte("null")) {
		return nil, nil
	}
	if err := json.Unmarshal(out, &sts); err != nil {
		return nil, fmt.Errorf("list: %w", err)
	}
	ids := make([]string, 0, len(sts))
	for _, s := range sts {
		ids = append(ids, s.ID)
	}
	return ids, nil
}

// Delete force-deletes; an absent container is fine.
func (c *CLI) Delete(ctx context.Context, id string) error {
	_, err := c.runID(ctx, id, "delete", "--force", id)
	if err != nil && c.absent(ctx, id) {
		return nil
	}
	return err
}

// absent reports whether the runtime's list (its JSON, not an error's
// text) lacks id: what a failed state or delete of an id means when it
// does. A list that fails says nothing: not absent.
func (c *CLI) absent(ctx context.Context, id string) bool {
	ids, err := c.List(ctx)
	return err == nil && !slices.Contains(ids, id)
}

// Kill sends a signal to the init process.
func (c *CLI) Kill(ctx context.Context, id string, sig int) error {
	_, err := c.runID(ctx, id, "kill", id, fmt.Sprint(sig))
	return err
}

// Version returns the first line of `--version`.
func Version(ctx context.Context, bin string) (string, error) {
	out, err := exec.CommandContext(ctx, bin, "--version").Output()
	if err != nil {
		return "", err
	}
	line, _, _ := strings.Cut(string(out), "\n")
	return strings.TrimSpace(line), nil
}

// Runtime gives a provider the verbs every OCI runtime CLI has in common
// (Launch and Detached to start a container; Kill, Delete, Status, List,
// InitPID); a provider embeds it and adds Name, Probe and Start.
type Runtime struct{ CLI *CLI }

// Launch writes inst's bundle and runs a verb of the runtime that leaves a
// container behind (run --detach, create); see Detached.
func (r Runtime) Launch(ctx context.Context, inst *provider.Instance, extra []*os.File, args ...string) error {
	if err := WriteBundle(inst, inst.Spec); err != nil {
		return err
	}
	return r.Detached(ctx, inst, extra, args...)
}

// Detached runs a verb that leaves a container behind (RunDetachedFiles),
// and on failure deletes what it may have left half-made: the caller then
// has nothing to take down.
func (r Runtime) Detached(ctx context.Context, inst *provider.Instance, extra []*os.File, args ...string) error {
	if err := r.CLI.RunDetachedFiles(ctx, inst, extra, args...); err != nil {
		r.CLI.Delete(context.WithoutCancel(ctx), inst.ID)
		return err
	}
	return nil
}

// ExecCommand is `RUNTIME exec --user UID:GID --cwd DIR ID ARGV...`, not
// started: its stdio are the caller's (provider.Execer). runc and runsc both
// forward the signals it gets to the process inside. It runs in a session
// of its own, away from the server's signals.
func (r Runtime) ExecCommand(id string, uid, gid int, dir string, argv []string) *exec.Cmd {
	args := append(append([]string(nil), r.CLI.Global...), "exec", "--user", fmt.Sprintf("%d:%d", uid, gid), "--cwd", dir, id)
	cmd := exec.Command(r.CLI.Binary, append(args, argv...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	return cmd
}

// OOMKills is the host kernel's OOM kill count in the container's memory
// cgroup (cgroup v1), and in those below it named subs.
func OOMKills(id string, subs ...string) int64 {
	var n int64
	for _, sub := range append([]string{""}, subs...) {
		b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory", oci.CgroupsPath(id), sub, "memory.oom_control"))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
				k, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				n += k
			}
		}
	}
	return n
}

// OOMKills is the host kernel's OOM kill count in the container's memory
// cgroup.
func (r Runtime) OOMKills(id string) int64 { return OOMKills(id) }

// Kill signals the container's init.
func (r Runtime) Kill(ctx context.Context, id string, sig int) error { return r.CLI.Kill(ctx, id, sig) }

// Delete kills and removes the container.
func (r Runtime) Delete(ctx context.Context, id string) error { return r.CLI.Delete(ctx, id) }

// Status reports the container's state.
func (r Runtime) Status(ctx context.Context, id string) (provider.Status, error) {
	return r.CLI.Status(ctx, id)
}

// List returns the containers the runtime knows under its root.
func (r Runtime) List(ctx context.Context) ([]string, error) { return r.CLI.List(ctx) }

// InitPID returns the host pid whose end means the container ended (runc:
// the container's init; runsc: the sandbox process).
func (r Runtime) InitPID(ctx context.Context, id string) (int, error) {
	out, err := r.CLI.runID(ctx, id, "state", id)
	if err != nil {
		return 0, err
	}
	var st state
	if err := json.Unmarshal(out, &st); err != nil {
		return 0, fmt.Errorf("state %s: %w", id, err)
	}
	if st.Pid <= 0 {
		return 0, fmt.Errorf("state %s: no pid", id)
	}
	return st.Pid, nil
}
