package client

import (
	"encoding/json"
	"time"
)

// Sandbox is a sandbox as the API shows it.
type Sandbox struct {
	ID          string    `json:"id"`
	Name        string    `json:"name"`
	Project     string    `json:"project"`
	Image       string    `json:"image"`
	ImageDigest string    `json:"image_digest"`
	Provider    string    `json:"provider"`
	State       string    `json:"state"` // creating, running, freezing, stopping, stopped, starting, removing, failed
	MemoryBytes int64     `json:"memory_bytes"`
	MemoryMiB   int64     `json:"memory_mib"`
	CPU         float64   `json:"cpu"`
	DiskBytes   int64     `json:"disk_bytes"`
	Pids        int64     `json:"pids_limit"`
	Env         []string  `json:"env"`
	IP          string    `json:"ip,omitempty"`
	OOMKills    int64     `json:"oom_kills"`
	Error       string    `json:"error,omitempty"`
	Session     string    `json:"session"`
	ParentID    string    `json:"parent_id,omitempty"`
	Origin      *Origin   `json:"origin,omitempty"` // what it was made from; absent for one made before servers said so
	Grants      []Grant   `json:"grants"`           // secrets it was given (names, never values)
	Policy      *Policy   `json:"policy,omitempty"` // its egress policy, if any
	Node        string    `json:"node,omitempty"`   // the node of a cluster it runs on
	CreatedAt   time.Time `json:"created_at"`
	StartedAt   time.Time `json:"started_at,omitzero"`
	StoppedAt   time.Time `json:"stopped_at,omitzero"`
}

// Origin is what a sandbox was made from, named as it was then: the names
// still say what it was after that is removed.
type Origin struct {
	Kind       string `json:"kind"`                 // image, snapshot, environment, fork, checkpoint (a restore), session (a resume)
	Name       string `json:"name,omitempty"`       // the image, snapshot, environment, forked sandbox or session; a checkpoint's tag
	ID         string `json:"id,omitempty"`         // the snapshot's, forked sandbox's or checkpoint's id
	Checkpoint string `json:"checkpoint,omitempty"` // the checkpoint a fork, environment or resume started from
}

// Node is one node of a cluster (GET /v0/nodes).
type Node struct {
	Name        string    `json:"name"`
	Address     string    `json:"address"`
	State       string    `json:"state"` // up, or unreachable (its lease expired)
	Self        bool      `json:"self"`  // the node that answered
	Sandboxes   int       `json:"sandboxes"`
	Providers   []string  `json:"providers"`
	MemoryBytes int64     `json:"memory_bytes"` // what its sandboxes may be given in all
	MemoryFree  int64     `json:"memory_free"`  // what is left of it (and of the host's free memory)
	Load        float64   `json:"load"`
	CPUs        int       `json:"cpus"`
	JoinedAt    time.Time `json:"joined_at"`
	SeenAt      time.Time `json:"seen_at,omitzero"`
}

// CreateRequest is the body of POST /v0/sandboxes. Sizes are a string with a
// unit ("512MiB") or a number of bytes; MemoryMiB is the SDKs' form.
type CreateRequest struct {
	Image     string          `json:"image"`
	Name      string          `json:"name,omitempty"`
	Memory    json.RawMessage `json:"memory,omitempty"`
	MemoryMiB int64           `json:"memory_mib,omitempty"`
	CPU       json.RawMessage `json:"cpu,omitempty"`
	Disk      json.RawMessage `json:"disk,omitempty"`
	Pids      int64           `json:"pids,omitempty"`
	Env       json.RawMessage `json:"env,omitempty"` // ["K=V"] or {"K":"V"}
	Provider  string          `json:"provider,omitempty"`
	// FromSnapshot starts the sandbox from a snapshot's files (id or
	// name); Image may then be left out (it is the snapshot's).
	FromSnapshot string `json:"from_snapshot,omitempty"`
	// Environment starts the sandbox warm from a named environment's
	// checkpoint: memory, processes and files as its setup left them. The
	// bounds are the environment's; Image, Memory, CPU, Disk and Pids must
	// be left out.
	Environment string `json:"environment,omitempty"`
	// Node places the sandbox on that node of a cluster (default: the
	// node with the most free memory that has the provider).
	Node string `json:"node,omitempty"`
}

// ExecRequest is the body of POST /v0/sandboxes/{id}/exec (and, URL-encoded
// in ?request=, of the WebSocket form).
type ExecRequest struct {
	Argv    []string        `json:"argv"`
	Env     json.RawMessage `json:"env,omitempty"`
	Workdir string          `json:"workdir,omitempty"`
	User    string          `json:"user,omitempty"`
	TTY     bool            `json:"tty,omitempty"`
	Rows    uint16          `json:"rows,omitempty"`
	Cols    uint16          `json:"cols,omitempty"`
	Timeout json.RawMessage `json:"timeout,omitempty"` // seconds (number) or a duration ("30s")
	Stdin   *string         `json:"stdin,omitempty"`   // base64; POST only: all of stdin, then EOF
	// Interactive (WebSocket only): stdin arrives as frames.
	Interactive bool `json:"interactive,omitempty"`
}

// ExecEvent is one line of the POST exec stream (application/x-ndjson).
type ExecEvent struct {
	Type     string `json:"type"` // started, stdout, stderr, exit, error
	PID      int    `json:"pid,omitempty"`
	Data     string `json:"data,omitempty"` // base64 of the bytes
	ExitCode *int   `json:"exit_code,omitempty"`
	Signal   int    `json:"signal,omitempty"`
	TimedOut bool   `json:"timed_out,omitempty"`
	OOM      bool   `json:"oom_killed,omitempty"`
	// Error, on an exit, says why the server ended the command: its
	// sandbox was stopped, removed or died, or did not end it at its
	// timeout.
	Error string `json:"error,omitempty"`
	// OutputCut, on an exit: a process the command left behind held its
	// output open; what it writes later is not sent.
	OutputCut bool `json:"output_cut,omitempty"`
	// Code, on an error: what ended the stream (sandbox_unreachable: the
	// sandbox's agent was lost; server_stopping: the server shut down, the
	// command runs on; invalid_argument: a framed body was malformed).
	Code string `json:"code,omitempty"`
}

// Image is a cached image.
type Image struct {
	Name    string    `json:"name"`
	Ref     string    `json:"ref"`
	Project string    `json:"project,omitempty"` // an imported image's project; none for a pulled image (shared)
	Digest  string    `json:"digest"`
	Size    int64     `json:"size"`
	Layers  int       `json:"layers"`
	Created time.Time `json:"created"`
	// Origin is the node of a cluster an imported image was copied from
	// on its first use on this node; none on the node that imported it.
	Origin string `json:"origin,omitempty"`
}

// PullRequest is the body of POST /v0/images/pull.
type PullRequest struct {
	Image string `json:"image"`
}

// PullEvent is one line of the pull stream: progress, then done or error.
type PullEvent struct {
	Type   string `json:"type"` // progress, done, error
	Layer  string `json:"layer,omitempty"`
	Status string `json:"status,omitempty"`
	Total  int64  `json:"total,omitempty"`
	Done   int64  `json:"done,omitempty"`
	Image  *Image `json:"image,omitempty"`
	Error  *Error `json:"error,omitempty"`
}

// Capabilities is one provider as `shard capabilities` shows it.
type Capabilities struct {
	Name       string `json:"name"`
	Available  bool   `json:"available"`
	Reason     string `json:"reason,omitempty"`
	Default    bool   `json:"default"`
	Fork       bool   `json:"fork"`
	Snapshot   bool   `json:"snapshot"`
	Checkpoint bool   `json:"checkpoint"`
	Isolation  string `json:"isolation"`
	Version    string `json:"version,omitempty"`
	ForkMemory string `json:"fork_memory,omitempty"` // how a fork's memory reaches it here
}

// Version is the server's build version and its API's.
type Version struct {
	Version string `json:"version"` // "dev" for a build without one
	API     string `json:"api"`     // "v0"
}

// Error is the body of every error answer, and the error the client returns.
type Error struct {
	Status  int    `json:"-"`
	Code    string `json:"code"`
	Message string `json:"message"`
	// RequestID is the answer's X-Request-Id: the request's id in the
	// server's access log ("" when no server answered).
	RequestID string `json:"-"`
}

func (e *Error) Error() string { return e.Message }

// ForkRequest is the body of POST /v0/sandboxes/{id}/fork.
type ForkRequest struct {
	Name  string `json:"name,omitempty"`
	Count int    `json:"count,omitempty"` // forks from one freeze; with count > 1, name is a prefix (NAME-1...)
	Tag   string `json:"tag,omitempty"`   // stored with the checkpoint event in the source's ledger
	// On-fork hooks (/etc/shard/on-fork.d in the sandbox) run in each fork
	// before the fork is answered: HookTimeout bounds each ("30s" by
	// default, at most "10m"); HookErrors "ignore" keeps forks whose hooks
	// fail (default "fail": the fork is refused, fork_hook_failed);
	// HooksInSource runs them in the source too, after the forks'.
	HookTimeout   string `json:"hook_timeout,omitempty"`
	HookErrors    string `json:"hook_errors,omitempty"`
	HooksInSource bool   `json:"hooks_in_source,omitempty"`
	// KeepCheckpoint keeps the fork's checkpoint until it is removed by
	// hand (shard checkpoint rm). Without it the checkpoint is removed
	// once no sandbox's resume starts from it: the source's, until it
	// checkpoints or forks again, and each fork's.
	KeepCheckpoint bool `json:"keep_checkpoint,omitempty"`
}

// ForkResponse is the answer to a fork with count > 1.
type ForkResponse struct {
	Sandboxes []Sandbox `json:"sandboxes"`
}

// Checkpoint is a saved instant of a running sandbox: its memory, processes
// and files (POST /v0/sandboxes/{id}/checkpoints, and every fork).
type Checkpoint struct {
	ID          string  `json:"id"`
	Kind        string  `json:"kind"` // checkpoint, fork or environment
	Tag         string  `json:"tag,omitempty"`
	SandboxID   string  `json:"sandbox_id"`   // the sandbox it was taken of (may be gone)
	SandboxName string  `json:"sandbox_name"` // its name then
	Session     string  `json:"session"`      // the ledger session the checkpoint event is in
	Seq         int64   `json:"seq"`          // that event's sequence number
	Image       string  `json:"image"`
	ImageDigest string  `json:"image_digest"`
	Provider    string  `json:"provider"`
	MemoryBytes int64   `json:"memory_bytes"`
	CPU         float64 `json:"cpu"`
	DiskBytes   int64   `json:"disk_bytes"`
	Size        int64   `json:"size"`      // bytes on disk: memory image plus files not shared
	FreezeMS    int64   `json:"freeze_ms"` // how long the sandbox was frozen for it
	// Memory is how its memory reaches a restore or fork: "handoff" (a
	// copy of the memory file, adopted) or "pages" (loaded page by page;
	// MemoryNote says why).
	Memory     string `json:"memory,omitempty"`
	MemoryNote string `json:"memory_note,omitempty"`
	// AutoRemove: shard removes it once no sandbox's resume starts from it
	// (a fork's checkpoint, made without keep_checkpoint). False: it stays
	// until removed by hand.
	AutoRemove bool      `json:"auto_remove"`
	CreatedAt  time.Time `json:"created_at"`
}

// SandboxRemoved is the answer to a remove of a sandbox.
type SandboxRemoved struct {
	Removed string `json:"removed"` // as the path gave it
	// Checkpoints removed with it: those asked for (checkpoints=true), and
	// forks' checkpoints no sandbox needs any more.
	Checkpoints []string `json:"checkpoints,omitempty"`
	FreedBytes  int64    `json:"freed_bytes,omitempty"` // their bytes on disk
}

// CheckpointRequest is the body of POST /v0/sandboxes/{id}/checkpoints.
type CheckpointRequest struct {
	Tag string `json:"tag,omitempty"`
}

// RestoreRequest is the body of POST /v0/checkpoints/{id}/restore
// (restoreCheckpoint): a new sandbox from a checkpoint, clean exec history.
type RestoreRequest struct {
	Name string `json:"name,omitempty"`
}

// Snapshot is the files of a stopped sandbox, which creates start from.
type Snapshot struct {
	ID          string    `json:"id"`
	Name        string    `json:"name"`
	SandboxID   string    `json:"sandbox_id"`
	SandboxName string    `json:"sandbox_name"`
	Image       string    `json:"image"`
	ImageDigest string    `json:"image_digest"`
	Provider    string    `json:"provider"`
	DiskBytes   int64     `json:"disk_bytes"`
	Env         []string  `json:"env"`
	Size        int64     `json:"size"` // bytes its files use on disk
	CreatedAt   time.Time `json:"created_at"`
}

// SnapshotRequest is the body of POST /v0/snapshots.
type SnapshotRequest struct {
	Sandbox string `json:"sandbox"` // id or name of a stopped sandbox
	Name    string `json:"name,omitempty"`
}

// Session is a ledger session: the durable event log of one sandbox.
type Session struct {
	Name        string    `json:"name"`
	SandboxID   string    `json:"sandbox_id"`
	SandboxName string    `json:"sandbox_name,omitempty"` // empty once the sandbox is removed
	Events      int64     `json:"events"`
	LastEvent   string    `json:"last_event,omitempty"`
	LastAt      time.Time `json:"last_at,omitzero"`
	CreatedAt   time.Time `json:"created_at"`
}

// Event is one ledger entry. Data depends on Type; see the OpenAPI document.
type Event struct {
	Seq       int64           `json:"seq"`
	Session   string          `json:"session"`
	Type      string          `json:"type"`
	SandboxID string          `json:"sandbox_id"`
	At        time.Time       `json:"at"`
	Data      json.RawMessage `json:"data,omitempty"`
}

// EventPage is a page of GET /v0/ledger/sessions/{name}/events; pass Next
// as ?after= for the next page. More says whether there is one.
type EventPage struct {
	Events []Event `json:"events"`
	Next   int64   `json:"next"`
	More   bool    `json:"more"`
}

// ResumeRequest is the body of POST /v0/ledger/sessions/{name}/resume.
type ResumeRequest struct {
	Name string `json:"name,omitempty"`
}

// ResumeResponse tells what resume started from and what it replayed.
type ResumeResponse struct {
	Sandbox    Sandbox        `json:"sandbox"`
	Checkpoint string         `json:"checkpoint,omitempty"` // empty: replayed from the session's start
	Replayed   []ReplayedExec `json:"replayed"`
	// Reapplied lists the grant and policy changes the session recorded
	// after that checkpoint, made again in their place among the execs.
	Reapplied []ReappliedChange `json:"reapplied,omitempty"`
}

// ReappliedChange is one grant or policy change that resume made again.
type ReappliedChange struct {
	Event  string `json:"event"`            // sandbox.secret_granted, sandbox.secret_ungranted, sandbox.policy_set or sandbox.policy_cleared
	Secret string `json:"secret,omitempty"` // for the grant events
	Error  string `json:"error,omitempty"`  // why it could not be made (the secret was removed since, say)
}

// ReplayedExec is one exec that resume ran again.
type ReplayedExec struct {
	Argv         []string `json:"argv"`
	RecordedExit *int     `json:"recorded_exit_code,omitempty"` // nil: it never finished
	ExitCode     *int     `json:"exit_code,omitempty"`          // nil: started and left running
	Error        string   `json:"error,omitempty"`
}

// Environment is a named, set-up-once sandbox state that creates start
// from warm.
type Environment struct {
	Name        string     `json:"name"`
	Image       string     `json:"image"`
	ImageDigest string     `json:"image_digest"`
	Provider    string     `json:"provider"`
	MemoryBytes int64      `json:"memory_bytes"`
	CPU         float64    `json:"cpu"`
	DiskBytes   int64      `json:"disk_bytes"`
	Env         []string   `json:"env,omitempty"`
	Setup       [][]string `json:"setup,omitempty"`
	Fingerprint string     `json:"fingerprint"` // changes when the definition does
	Checkpoint  string     `json:"checkpoint"`
	CreatedAt   time.Time  `json:"created_at"`
	// Origin is, in a cluster, the node that built it when the node that
	// answered holds a copy (made on its first use there).
	Origin string `json:"origin,omitempty"`
}

// EnvironmentRequest is the body of POST /v0/environments. Either Setup
// (commands the server runs, in order, each must exit 0) or Sandbox (a
// running sandbox the caller set up, checkpointed as the environment; the
// SDKs' setup callback) — not both. With the same name and the same
// fingerprint as an existing environment the call does nothing (200);
// a different definition rebuilds it (201).
type EnvironmentRequest struct {
	Name      string          `json:"name"`
	Image     string          `json:"image,omitempty"`
	Memory    json.RawMessage `json:"memory,omitempty"`
	MemoryMiB int64           `json:"memory_mib,omitempty"`
	CPU       json.RawMessage `json:"cpu,omitempty"`
	Disk      json.RawMessage `json:"disk,omitempty"`
	Env       json.RawMessage `json:"env,omitempty"`
	Provider  string          `json:"provider,omitempty"`
	Setup     [][]string      `json:"setup,omitempty"`
	Sandbox   string          `json:"sandbox,omitempty"`
	// Fingerprint identifies the definition; the server computes it from
	// the fields above when left out (the SDKs pass one that covers their
	// setup callback).
	Fingerprint string `json:"fingerprint,omitempty"`
}

// DiskUsage is what `shard df` shows: what each kind of thing holds on disk.
type DiskUsage struct {
	Images       DiskUsageItem `json:"images"`
	Sandboxes    DiskUsageItem `json:"sandboxes"`
	Snapshots    DiskUsageItem `json:"snapshots"`
	Checkpoints  DiskUsageItem `json:"checkpoints"`
	Environments DiskUsageItem `json:"environments"` // their checkpoints (not counted again under checkpoints)
	Server       DiskUsageItem `json:"server"`       // the database, agent binaries, filesystem templates, logs
	TotalBytes   int64         `json:"total_bytes"`
	// Store is the sandbox store: its size, what is promised (every
	// sandbox's whole disk bound, and the blocks of saved copies), and what
	// a new sandbox, fork, snapshot or checkpoint may still ask for.
	Store StoreSpace `json:"store"`
	// Host is the filesystem of the server's data directory, on which the
	// store, images and memory images live.
	Host HostSpace `json:"host"`
}

// HostSpace is the data directory's filesystem and what the server keeps
// free of it for the rest of the host (shard serve --reserve).
type HostSpace struct {
	TotalBytes   int64 `json:"total_bytes"`
	FreeBytes    int64 `json:"free_bytes"`
	ReserveBytes int64 `json:"reserve_bytes"`
}

// StoreSpace is the sandbox store's capacity and promises, in bytes.
type StoreSpace struct {
	CapacityBytes int64 `json:"capacity_bytes"`
	PromisedBytes int64 `json:"promised_bytes"`
	ReservedBytes int64 `json:"reserved_bytes"` // the filesystem's own use and a margin
	FreeBytes     int64 `json:"free_bytes"`
	// SizeBytes is the store image's size on the host (0: a store this
	// server did not make), MaxBytes the most it may grow to now.
	SizeBytes int64 `json:"size_bytes"`
	MaxBytes  int64 `json:"max_bytes"`
}

// DiskUsageItem is a count and the bytes they use.
type DiskUsageItem struct {
	Count int   `json:"count"`
	Bytes int64 `json:"bytes"`
}

// Token is an API key's record as the API shows it (never the key).
type Token struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	Project   string    `json:"project"` // "*": every project
	Scopes    []string  `json:"scopes"`
	CreatedAt time.Time `json:"created_at"`
}

// Project is a project and how many objects of each kind it holds (GET
// /v0/projects).
type Project struct {
	Name         string `json:"name"`
	Sandboxes    int    `json:"sandboxes"`
	Sessions     int    `json:"sessions"`
	Checkpoints  int    `json:"checkpoints"`
	Snapshots    int    `json:"snapshots"`
	Environments int    `json:"environments"`
	Secrets      int    `json:"secrets"`
	Tokens       int    `json:"tokens"`
	// Quota is what an administrator bounds the project to (zero fields:
	// no bound), Use what it holds against it.
	Quota ProjectQuota `json:"quota"`
	Use   ProjectUse   `json:"use"`
}

// ProjectQuota bounds what one project may hold (PUT
// /v0/projects/{name}/quota); a field left out or 0 has no bound.
type ProjectQuota struct {
	MaxSandboxes   int64 `json:"max_sandboxes,omitempty"`    // sandboxes, whatever their state
	MaxMemoryBytes int64 `json:"max_memory_bytes,omitempty"` // memory bounds of its running sandboxes and warm spares
	MaxCPUMillis   int64 `json:"max_cpu_millis,omitempty"`   // their cpu bounds (1000 = one cpu)
	MaxDiskBytes   int64 `json:"max_disk_bytes,omitempty"`   // disk bounds of its sandboxes, whatever their state
	MaxSavedBytes  int64 `json:"max_saved_bytes,omitempty"`  // what its checkpoints and snapshots take
	MaxLedgerBytes int64 `json:"max_ledger_bytes,omitempty"` // what its ledger's events take
}

// ProjectUse is what a project holds, in a quota's terms.
type ProjectUse struct {
	Sandboxes   int64 `json:"sandboxes"`
	MemoryBytes int64 `json:"memory_bytes"`
	CPUMillis   int64 `json:"cpu_millis"`
	DiskBytes   int64 `json:"disk_bytes"`
	SavedBytes  int64 `json:"saved_bytes"`
	LedgerBytes int64 `json:"ledger_bytes"`
}

// TokenRequest is the body of POST /v0/tokens.
type TokenRequest struct {
	Name   string   `json:"name"`
	Scopes []string `json:"scopes"`
	// Project is the one project the key may act in ("" is the project of
	// the request that makes it); "*" makes a key of every project, which
	// only such a key may make.
	Project string `json:"project,omitempty"`
}

// TokenCreated is the answer to POST /v0/tokens: Key is shown this once.
type TokenCreated struct {
	Token
	Key string `json:"key"`
}

// Whoami is the answer to GET /v0/whoami: the key that asked (the Unix
// socket's administrator is "admin", with every scope in every project).
type Whoami struct {
	Name        string   `json:"name"`
	Project     string   `json:"project"` // "*": every project
	Scopes      []string `json:"scopes"`
	AllProjects bool     `json:"all_projects"`
}

// Secret is a stored secret as the API shows it: its name, never its value.
type Secret struct {
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// SecretRequest is the body of PUT /v0/secrets/{name}: the value, base64.
type SecretRequest struct {
	Value []byte `json:"value"`
}

// Grant gives a secret to a sandbox: as the environment variable Env of
// every exec (Env defaults to the secret's name), or as the file File.
type Grant struct {
	Secret string    `json:"secret"`
	Env    string    `json:"env,omitempty"`
	File   string    `json:"file,omitempty"`
	At     time.Time `json:"at,omitzero"`
}

// Policy is a sandbox's egress network policy. Entries are an IPv4 address,
// a CIDR, or a domain name ("example.org" and its subdomains;
// "*.example.org" only subdomains). Deny wins over allow; with DenyAll or
// any Allow entry, what is not allowed is denied.
type Policy struct {
	DenyAll bool     `json:"deny_all,omitempty"`
	Allow   []string `json:"allow,omitempty"`
	Deny    []string `json:"deny,omitempty"`
}
