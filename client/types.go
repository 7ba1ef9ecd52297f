package client

import (
	"encoding/json"
	"time"
)

// Sandbox is a sandbox as the API shows it.
type Sandbox struct {
	ID          string    `json:"id"`
	Name        string    `json:"name"`
	Image       string    `json:"image"`
	ImageDigest string    `json:"image_digest"`
	Provider    string    `json:"provider"`
	State       string    `json:"state"` // creating, running, stopping, stopped, starting, removing, failed
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
	CreatedAt   time.Time `json:"created_at"`
	StartedAt   time.Time `json:"started_at,omitzero"`
	StoppedAt   time.Time `json:"stopped_at,omitzero"`
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
}

// Image is a cached image.
type Image struct {
	Name    string    `json:"name"`
	Ref     string    `json:"ref"`
	Digest  string    `json:"digest"`
	Size    int64     `json:"size"`
	Layers  int       `json:"layers"`
	Created time.Time `json:"created"`
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
}

// Error is the body of every error answer, and the error the client returns.
type Error struct {
	Status  int    `json:"-"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return e.Message }

// ForkRequest is the body of POST /v0/sandboxes/{id}/fork.
type ForkRequest struct {
	Name  string `json:"name,omitempty"`
	Count int    `json:"count,omitempty"` // forks from one freeze; with count > 1, name is a prefix (NAME-1...)
	Tag   string `json:"tag,omitempty"`   // stored with the checkpoint event in the source's ledger
}

// ForkResponse is the answer to a fork with count > 1.
type ForkResponse struct {
	Sandboxes []Sandbox `json:"sandboxes"`
}
