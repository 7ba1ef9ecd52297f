// Package provider is the seam between shard and an isolation runtime.
//
// A Provider runs and stops sandboxes from an OCI bundle. What a runtime can
// do beyond that is an optional interface (Checkpointer for memory
// checkpoint/restore, which fork needs), found by type assertion; `shard
// capabilities` is derived from exactly these, so it cannot lie.
package provider

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Capabilities is what `shard capabilities` shows for one provider.
type Capabilities struct {
	Name       string `json:"name"`
	Available  bool   `json:"available"`
	Reason     string `json:"reason,omitempty"` // why not available
	Default    bool   `json:"default"`
	Fork       bool   `json:"fork"`
	Snapshot   bool   `json:"snapshot"`
	Checkpoint bool   `json:"checkpoint"`
	Isolation  string `json:"isolation"` // e.g. "user-space kernel", "linux namespaces", "micro-VM"
	Version    string `json:"version,omitempty"`
	// ForkMemory says how a fork's memory reaches it on this host, and
	// when it takes the slower path (ImageDescriber says which one a
	// checkpoint took).
	ForkMemory string `json:"fork_memory,omitempty"`
}

// Instance is one run of a sandbox: a bundle directory and its spec.
type Instance struct {
	ID     string // runtime container id, fixed length
	Bundle string // the provider writes config.json here
	Spec   *specs.Spec
	LogOut string // file that gets the container process's stdout and stderr
	Log    *slog.Logger
}

// Status is what the runtime reports about a container.
type Status string

const (
	StatusRunning Status = "running"
	StatusPaused  Status = "paused"
	StatusStopped Status = "stopped" // exists but not running
	StatusAbsent  Status = "absent"  // unknown to the runtime
)

// Provider runs sandboxes.
type Provider interface {
	Name() string
	// Probe reports whether the provider works on this host, and what it can do.
	Probe(ctx context.Context) Capabilities
	// Start creates and starts the container; on error nothing is left.
	Start(ctx context.Context, inst *Instance) error
	// Kill sends a signal to the container's init process.
	Kill(ctx context.Context, id string, signal int) error
	// Delete stops (SIGKILL) and removes the container; absent is fine.
	Delete(ctx context.Context, id string) error
	// Status reports the container's state.
	Status(ctx context.Context, id string) (Status, error)
	// List returns the ids of the containers the runtime knows.
	List(ctx context.Context) ([]string, error)
}

// Guest is a runtime whose sandboxes run a kernel of their own (gVisor's
// Sentry). That kernel has no OOM killer, so the sandbox's agent holds the
// memory and pids bounds inside (and counts what it kills), and the host
// cgroup is a backstop with room for the kernel itself.
type Guest interface {
	// HostBounds is the host cgroup's memory and pids bounds of a sandbox
	// whose guest may have memory bytes and pids processes.
	HostBounds(memory, pids int64) (hostMemory, hostPids int64)
	// GuestSpec adds to spec what the sandbox's agent needs to hold the
	// bounds inside (its environment and capabilities).
	GuestSpec(spec *specs.Spec, memory, pids int64)
	// MinCPU is the least CPU (millicpus) a sandbox boots with in
	// reasonable time.
	MinCPU() int64
}

// OOMCounter is a runtime that can say how many of a container's processes
// the host kernel killed for memory (its memory cgroups' counts; gone once
// the container is deleted).
type OOMCounter interface {
	OOMKills(id string) int64
}

// Execer is a provider that can run a process in a running sandbox whose
// stdio are the caller's own files: the way bulk data (a file copied in or
// out) moves at the runtime's own speed, where the agent's connection
// through a sandbox's network stack moves it several times slower.
type Execer interface {
	// ExecCommand is the host command that runs argv in container id as
	// user uid:gid, in dir; the caller sets its stdio, starts and waits
	// for it. A signal sent to it reaches the process inside.
	ExecCommand(id string, uid, gid int, dir string, argv []string) *exec.Cmd
}

// HoleHider is a provider whose running sandboxes do not see their files'
// holes: inside gVisor's Sentry SEEK_DATA finds every byte data and
// st_blocks says the size. What reads a sparse file there finds its holes
// by reading it (files.GetOptions.ReadHoles).
type HoleHider interface {
	HidesHoles() bool
}

// PIDer is a provider that can name the host process whose end means the
// sandbox ended, so the server can notice a sandbox that died on its own.
type PIDer interface {
	InitPID(ctx context.Context, id string) (int, error)
}

// Checkpointer is a provider that can save a running sandbox's memory,
// processes and files and start new sandboxes from that image (fork).
type Checkpointer interface {
	Pause(ctx context.Context, id string) error
	Resume(ctx context.Context, id string) error
	// Checkpoint writes an image of the container to dir and leaves it running.
	Checkpoint(ctx context.Context, id, dir string) error
	// Prepare makes inst's sandbox ready to receive a restore of the image
	// in dir: all but the restore itself.
	Prepare(ctx context.Context, inst *Instance, dir string) error
	// Restore starts inst, prepared, from the image in dir.
	Restore(ctx context.Context, inst *Instance, dir string) error
}

// AheadMaker is a Checkpointer that can create a sandbox before the image
// it will be restored from exists (a sandbox made ahead): CreateAhead runs
// inst's runtime sandbox, processes, cgroup and network, with its root an
// empty mount point over which the restored sandbox's root filesystem is
// mounted later; PrepareAhead then does what Prepare does but the create,
// and Restore starts it.
type AheadMaker interface {
	CreateAhead(ctx context.Context, inst *Instance) error
	PrepareAhead(ctx context.Context, inst *Instance, dir string) error
}

// PauseTracker is a Checkpointer that remembers its pauses across a restart
// of the server. sure is false when a pause was asked for but its answer
// never came: it may have paused, or not.
type PauseTracker interface {
	Paused(id string) (paused, sure bool)
}

// ImageStager is a Checkpointer that gets a checkpoint's image ready in dir
// before the sandbox is paused, so the pause holds less.
type ImageStager interface {
	StageImage(ctx context.Context, id, dir string) error
}

// Ways a checkpoint's memory reaches a restore (ImageDescriber).
const (
	// MemoryHandoff: the image is a copy of the sandbox's memory file; a
	// restore adopts a copy of it and loads no page.
	MemoryHandoff = "handoff"
	// MemoryPages: the image is the runtime's pages file, loaded page by
	// page into the restored sandbox's memory.
	MemoryPages = "pages"
)

// ImageDescriber is a Checkpointer that can say how the memory of the image
// it just wrote to dir reaches a restore (MemoryHandoff or MemoryPages), and
// why not the faster way when it could not.
type ImageDescriber interface {
	MemoryPath(dir string) (path, note string)
}

// ImagePersister is a Checkpointer whose images may reach the disk after
// Checkpoint returns (held in RAM meanwhile, linked from dir). Persisted
// returns once dir's image is all on disk, finishing a copy that a restart
// interrupted.
type ImagePersister interface {
	Persisted(ctx context.Context, dir string) error
}

// Closer is a provider with work of its own in the background (a
// checkpoint image being copied to disk): Close waits for it, until ctx
// ends, when the server shuts down.
type Closer interface {
	Close(ctx context.Context) error
}

// ErrImageLost is what Persisted returns for an image whose pages were still
// in RAM when the host went down: the checkpoint cannot be restored.
var ErrImageLost = errors.New("the checkpoint's memory image was in RAM when the host restarted, and is lost")

// RemoveImage removes a checkpoint image directory, and what its symbolic
// links point to (an ImagePersister's pages still in RAM).
func RemoveImage(dir string) error {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.Type()&os.ModeSymlink != 0 {
			if target, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil {
				os.Remove(target)
			}
		}
	}
	return os.RemoveAll(dir)
}

// Unavailable is a provider that cannot run on this host. It is listed by
// `shard capabilities` with the reason, and refuses everything.
type Unavailable struct {
	Caps Capabilities
}

func (u *Unavailable) Name() string                            { return u.Caps.Name }
func (u *Unavailable) Probe(context.Context) Capabilities      { return u.Caps }
func (u *Unavailable) Start(context.Context, *Instance) error  { return u.err() }
func (u *Unavailable) Kill(context.Context, string, int) error { return u.err() }
func (u *Unavailable) Delete(context.Context, string) error    { return nil }
func (u *Unavailable) Status(context.Context, string) (Status, error) {
	return StatusAbsent, nil
}
func (u *Unavailable) List(context.Context) ([]string, error) { return nil, nil }

func (u *Unavailable) err() error {
	return &NotAvailableError{Name: u.Caps.Name, Reason: u.Caps.Reason}
}

// NotAvailableError says a provider cannot run here.
type NotAvailableError struct{ Name, Reason string }

func (e *NotAvailableError) Error() string {
	return "provider " + e.Name + " is not available on this host: " + e.Reason
}
