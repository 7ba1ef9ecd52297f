// Package client is the Go SDK for a shard server, and what the `shard` CLI
// itself uses. It speaks the REST API under /v0, over the server's Unix
// socket (the administrator's way in) or over HTTP(S) to SHARD_REMOTE with
// the API key in SHARD_API_KEY.
package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path"
	"strconv"
	"strings"
	"time"
)

// DefaultSocket is where `shard serve` listens by default.
const DefaultSocket = "/run/shard/shard.sock"

// Options say how to reach the server. Empty fields come from the
// environment: SHARD_REMOTE, SHARD_API_KEY; else the default socket.
type Options struct {
	Socket string // Unix socket path
	Remote string // base URL, e.g. http://10.0.0.5:7070
	APIKey string
	// Project is the project requests act in (header Shard-Project); ""
	// is SHARD_PROJECT, else the key's own project (or, for the socket and
	// keys of every project, "default").
	Project string
	// Transport carries the requests to Remote (nil: a connection pool of
	// the client's own). A node of a cluster calls another through one
	// that signs each call (internal/peer).
	Transport http.RoundTripper
}

// ProjectHeader is the header that names a request's project.
const ProjectHeader = "Shard-Project"

// RequestIDHeader is the header of a request's id: the server answers with
// it (Error.RequestID), and takes a caller's own.
const RequestIDHeader = "X-Request-Id"

// Client talks to one server. It is safe for concurrent use.
type Client struct {
	base    string // scheme://host, without /v0
	apiKey  string
	project string
	hc      *http.Client
	dialer  func(ctx context.Context) (net.Conn, error)
}

// New makes a client. Remote wins over Socket; with neither, SHARD_REMOTE,
// then the default socket.
func New(o Options) (*Client, error) {
	if o.Remote == "" && o.Socket == "" {
		o.Remote = os.Getenv("SHARD_REMOTE")
	}
	if o.APIKey == "" {
		o.APIKey = os.Getenv("SHARD_API_KEY")
	}
	if o.Project == "" {
		o.Project = os.Getenv("SHARD_PROJECT")
	}
	c := &Client{apiKey: o.APIKey, project: o.Project}
	tr := &http.Transport{MaxIdleConnsPerHost: 16, IdleConnTimeout: 90 * time.Second}
	if o.Remote != "" {
		u, err := url.Parse(strings.TrimRight(o.Remote, "/"))
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("SHARD_REMOTE %q is not an http(s) URL", o.Remote)
		}
		c.base = u.Scheme + "://" + u.Host
		var d net.Dialer
		c.dialer = func(ctx context.Context) (net.Conn, error) { return d.DialContext(ctx, "tcp", u.Host) }
	} else {
		if o.Socket == "" {
			o.Socket = DefaultSocket
		}
		sock := o.Socket
		var d net.Dialer
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "unix", sock)
		}
		c.dialer = func(ctx context.Context) (net.Conn, error) { return d.DialContext(ctx, "unix", sock) }
		c.base = "http://shard"
	}
	c.hc = &http.Client{Transport: tr}
	if o.Transport != nil {
		c.hc = &http.Client{Transport: o.Transport}
	}
	return c, nil
}

func (c *Client) newRequest(ctx context.Context, method, path string, body io.Reader) (*http.Request, error) {
	if err := checkPath(path); err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+"/v0"+path, body)
	if err != nil {
		return nil, err
	}
	c.authorize(req.Header)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return req, nil
}

// authorize sets the headers that say who asks and in which project.
func (c *Client) authorize(h http.Header) {
	if c.apiKey != "" {
		h.Set("Authorization", "Bearer "+c.apiKey)
	}
	if c.project != "" {
		h.Set(ProjectHeader, c.project)
	}
}

// do sends a request and returns the response if it succeeded (2xx); any
// other answer becomes an *Error.
func (c *Client) do(ctx context.Context, method, path string, in any) (*http.Response, error) {
	var body io.Reader
	if in != nil {
		if r, ok := in.(io.Reader); ok {
			body = r
		} else {
			b, err := json.Marshal(in)
			if err != nil {
				return nil, err
			}
			body = bytes.NewReader(b)
		}
	}
	return c.Do(ctx, method, path, body, "")
}

func (c *Client) connErr(err error) error {
	if strings.HasPrefix(c.base, "http://shard") {
		return fmt.Errorf("cannot reach the shard server (is `shard serve` running? as root?): %w", err)
	}
	return fmt.Errorf("cannot reach the shard server at %s: %w", c.base, err)
}

func readError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	e := &Error{Status: resp.StatusCode, RequestID: resp.Header.Get(RequestIDHeader)}
	if json.Unmarshal(b, e) != nil || e.Message == "" {
		e.Code = "http_" + fmt.Sprint(resp.StatusCode)
		e.Message = fmt.Sprintf("server answered %s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	return e
}

// Call sends method path (under /v0, with its query; each segment escaped
// by the caller) with in as its JSON body (nil: none; an io.Reader: its
// bytes as they are), and decodes a 2xx answer's JSON into out (nil: the
// answer is dropped); any other answer is an *Error. It reaches what this
// package has no method for, such as the calls between a cluster's nodes.
func (c *Client) Call(ctx context.Context, method, path string, in, out any) error {
	return c.call(ctx, method, path, in, out)
}

// Do sends method path (as Call) with body, of type contentType, and
// returns a 2xx answer for the caller to read and close; any other answer
// is an *Error. It is Call for a body or an answer that is not JSON (a
// stream).
func (c *Client) Do(ctx context.Context, method, path string, body io.Reader, contentType string) (*http.Response, error) {
	req, err := c.newRequest(ctx, method, path, body)
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, c.connErr(err)
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		return nil, readError(resp)
	}
	return resp, nil
}

func (c *Client) call(ctx context.Context, method, path string, in, out any) error {
	resp, err := c.do(ctx, method, path, in)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decode the server's answer: %w", err)
	}
	return nil
}

// esc escapes s as one path segment: an id, a name, a tag or a secret is
// never more than one, whatever characters it has ("a/b" is a%2Fb, "?" is
// %3F). "", "." and ".." can be no segment (the server cleans them out of
// the path and would answer another endpoint): they are marked, and
// checkPath refuses the request before it is sent.
func esc(s string) string {
	if s == "" || s == "." || s == ".." {
		return badSegment + s + badSegment
	}
	return url.PathEscape(s)
}

// escRef escapes an image reference: its '/'-separated components each as
// a segment ("localhost:5000/a/b:1" stays readable, "a?b" is a%3Fb).
func escRef(ref string) string {
	parts := strings.Split(ref, "/")
	for i, p := range parts {
		parts[i] = esc(p)
	}
	return strings.Join(parts, "/")
}

// badSegment brackets a value esc could not make a segment of.
const badSegment = "\x00"

// checkPath refuses a path with a segment esc marked, naming the value.
func checkPath(path string) error {
	i := strings.Index(path, badSegment)
	if i < 0 {
		return nil
	}
	v, _, _ := strings.Cut(path[i+1:], badSegment)
	return &Error{Code: CodeInvalidArgument, Message: fmt.Sprintf("%q is not an id, name or reference: it cannot be part of a URL path", v)}
}

// Capabilities lists the server's providers.
func (c *Client) Capabilities(ctx context.Context) ([]Capabilities, error) {
	var out struct {
		Providers []Capabilities `json:"providers"`
	}
	err := c.call(ctx, "GET", "/capabilities", nil, &out)
	return out.Providers, err
}

// Create makes and starts a sandbox.
func (c *Client) Create(ctx context.Context, req CreateRequest) (*Sandbox, error) {
	var out Sandbox
	if err := c.call(ctx, "POST", "/sandboxes", req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// List returns every sandbox of the client's project.
func (c *Client) List(ctx context.Context) ([]Sandbox, error) { return c.list(ctx, "") }

// ListAllProjects returns every project's sandboxes (a key of every
// project only; the socket is one).
func (c *Client) ListAllProjects(ctx context.Context) ([]Sandbox, error) {
	return c.list(ctx, "?all_projects=true")
}

func (c *Client) list(ctx context.Context, query string) ([]Sandbox, error) {
	var out struct {
		Sandboxes []Sandbox `json:"sandboxes"`
	}
	err := c.call(ctx, "GET", "/sandboxes"+query, nil, &out)
	return out.Sandboxes, err
}

// Get returns one sandbox by id or name.
func (c *Client) Get(ctx context.Context, idOrName string) (*Sandbox, error) {
	var out Sandbox
	if err := c.call(ctx, "GET", "/sandboxes/"+esc(idOrName), nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Stop ends a sandbox's processes; its files stay.
func (c *Client) Stop(ctx context.Context, idOrName string) (*Sandbox, error) {
	var out Sandbox
	if err := c.call(ctx, "POST", "/sandboxes/"+esc(idOrName)+"/stop", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Start boots a stopped sandbox.
func (c *Client) Start(ctx context.Context, idOrName string) (*Sandbox, error) {
	var out Sandbox
	if err := c.call(ctx, "POST", "/sandboxes/"+esc(idOrName)+"/start", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Remove deletes a sandbox; force removes a running one.
func (c *Client) Remove(ctx context.Context, idOrName string, force bool) error {
	return c.call(ctx, "DELETE", "/sandboxes/"+esc(idOrName)+fmt.Sprintf("?force=%t", force), nil, nil)
}

// RemoveOptions says how a sandbox is removed (DELETE /v0/sandboxes/{id}).
type RemoveOptions struct {
	Force bool // a running one too
	// Checkpoints takes the checkpoints of the sandbox's ledger session
	// with it, or nothing is removed (409 checkpoint_in_use) when another
	// sandbox or an environment needs one.
	Checkpoints bool
}

// RemoveWith removes a sandbox as o says, and says what went with it.
func (c *Client) RemoveWith(ctx context.Context, idOrName string, o RemoveOptions) (*SandboxRemoved, error) {
	var out SandboxRemoved
	q := fmt.Sprintf("?force=%t&checkpoints=%t", o.Force, o.Checkpoints)
	if err := c.call(ctx, "DELETE", "/sandboxes/"+esc(idOrName)+q, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ExecResult is a finished command.
type ExecResult struct {
	Stdout   []byte
	Stderr   []byte
	ExitCode int
	Signal   int
	TimedOut bool
	OOM      bool
	Error    string // why the server ended the command, if it did (see ExecEvent.Error)
	// OutputCut: a process the command left behind (sh -c 'server &')
	// held its output open at its exit; what it wrote after is not here.
	OutputCut bool
}

// Exec runs a command and collects its output.
func (c *Client) Exec(ctx context.Context, idOrName string, req ExecRequest) (*ExecResult, error) {
	var out, errb bytes.Buffer
	res, err := c.ExecStream(ctx, idOrName, req, &out, &errb)
	if err != nil {
		return nil, err
	}
	res.Stdout, res.Stderr = out.Bytes(), errb.Bytes()
	return res, nil
}

// ExecStream runs a command, writing its output to stdout and stderr as it
// arrives.
func (c *Client) ExecStream(ctx context.Context, idOrName string, req ExecRequest, stdout, stderr io.Writer) (*ExecResult, error) {
	return c.ExecPipe(ctx, idOrName, req, nil, stdout, stderr)
}

// ExecPipe runs a command with its stdin read from stdin as the command
// takes it (nil: req.Stdin, or none), writing its output to stdout and
// stderr as it arrives. Output comes in the binary stream (StreamMediaType);
// stdin goes in a framed request body, sent while the output comes back.
// When the command ends first, stdin is read no further (a Read already
// waiting on stdin returns in its own time).
func (c *Client) ExecPipe(ctx context.Context, idOrName string, req ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (*ExecResult, error) {
	return c.execPipe(ctx, idOrName, req, stdin, nil, stdout, stderr)
}

// ExecPipeSignals is ExecPipe that also sends each signal number that comes
// on signals (SIGINT is 2, SIGTERM 15) to the command's process group while
// it runs, as the signal frames of a framed request body. With a nil stdin
// the command's stdin is closed at once.
func (c *Client) ExecPipeSignals(ctx context.Context, idOrName string, req ExecRequest, stdin io.Reader, signals <-chan int, stdout, stderr io.Writer) (*ExecResult, error) {
	if stdin == nil && req.Stdin == nil {
		// Signals go in a framed body, which needs stdin: an empty one.
		stdin = strings.NewReader("")
	}
	return c.execPipe(ctx, idOrName, req, stdin, signals, stdout, stderr)
}

func (c *Client) execPipe(ctx context.Context, idOrName string, req ExecRequest, stdin io.Reader, signals <-chan int, stdout, stderr io.Writer) (*ExecResult, error) {
	path := "/sandboxes/" + esc(idOrName) + "/exec"
	var body io.Reader
	ctype := "application/json"
	var stop func()
	if stdin == nil {
		b, err := json.Marshal(req)
		if err != nil {
			return nil, err
		}
		body = bytes.NewReader(b)
	} else {
		if req.Stdin != nil {
			return nil, errors.New("exec: give stdin as the reader or in the request, not both")
		}
		b, err := json.Marshal(req)
		if err != nil {
			return nil, err
		}
		fb := newFramedBody(b, stdin)
		fb.signals = signals
		body, ctype, stop = fb, StreamMediaType, func() { fb.Close() }
		defer stop()
	}
	hreq, err := c.newRequest(ctx, "POST", path, body)
	if err != nil {
		return nil, err
	}
	hreq.Header.Set("Content-Type", ctype)
	hreq.Header.Set("Accept", StreamMediaType+", application/x-ndjson;q=0.5")
	resp, err := c.hc.Do(hreq)
	if err != nil {
		return nil, c.connErr(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		return nil, readError(resp)
	}
	if ct, _, _ := strings.Cut(resp.Header.Get("Content-Type"), ";"); strings.TrimSpace(ct) == "application/x-ndjson" {
		return readNDJSONExec(resp.Body, stdout, stderr) // a server from before the binary stream
	}
	return readFramedExec(resp.Body, stdout, stderr)
}

var errExecEnded = errors.New("the command ended")

// ExecStarted is the started frame's payload (openapi.json's ExecStarted).
type ExecStarted struct {
	PID int `json:"pid"`
}

// ExecExit is the exit frame's payload (openapi.json's ExecExit). Its
// fields are in the order of the agent's exit, which the server once passed
// on as it came: the server writes the same bytes as before.
type ExecExit struct {
	Code     int    `json:"exit_code"`
	Signal   int    `json:"signal,omitempty"`
	TimedOut bool   `json:"timed_out,omitempty"`
	OOM      bool   `json:"oom_killed,omitempty"`
	Error    string `json:"error,omitempty"`
	// What went through the command's stdin, stdout and stderr, as the
	// sandbox counted it; not in ExecResult (the ledger's exec_finished
	// has them too).
	StdinBytes  int64 `json:"stdin_bytes,omitempty"`
	StdoutBytes int64 `json:"stdout_bytes,omitempty"`
	StderrBytes int64 `json:"stderr_bytes,omitempty"`
	OutputCut   bool  `json:"output_cut,omitempty"`
}

func (e ExecExit) result() *ExecResult {
	return &ExecResult{ExitCode: e.Code, Signal: e.Signal, TimedOut: e.TimedOut, OOM: e.OOM, Error: e.Error, OutputCut: e.OutputCut}
}

func readFramedExec(r io.Reader, stdout, stderr io.Writer) (*ExecResult, error) {
	fr := &frameReader{r: bufio.NewReaderSize(r, 64<<10)}
	for {
		typ, p, err := fr.next()
		if err != nil {
			if err == io.EOF {
				break
			}
			return nil, fmt.Errorf("exec stream: %w", err)
		}
		switch typ {
		case FrameStdout, FrameStderr:
			w := stdout
			if typ == FrameStderr {
				w = stderr
			}
			if w != nil {
				w.Write(p)
			}
		case FrameExit:
			var ex ExecExit
			if err := json.Unmarshal(p, &ex); err != nil {
				return nil, fmt.Errorf("exec stream: exit: %w", err)
			}
			return ex.result(), nil
		case FrameError:
			e := &Error{Status: 502}
			if json.Unmarshal(p, e) != nil || e.Message == "" {
				e.Code, e.Message = CodeSandboxUnreachable, string(p)
			}
			return nil, e
		}
	}
	return nil, &Error{Status: 502, Code: CodeStreamEnded, Message: "the exec stream ended before the command did"}
}

func readNDJSONExec(r io.Reader, stdout, stderr io.Writer) (*ExecResult, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var ev ExecEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return nil, fmt.Errorf("exec stream: %w", err)
		}
		switch ev.Type {
		case "stdout", "stderr":
			b, err := base64.StdEncoding.DecodeString(ev.Data)
			if err != nil {
				return nil, fmt.Errorf("exec stream: %w", err)
			}
			w := stdout
			if ev.Type == "stderr" {
				w = stderr
			}
			if w != nil {
				w.Write(b)
			}
		case "exit":
			r := &ExecResult{Signal: ev.Signal, TimedOut: ev.TimedOut, OOM: ev.OOM, Error: ev.Error, OutputCut: ev.OutputCut}
			if ev.ExitCode != nil {
				r.ExitCode = *ev.ExitCode
			}
			return r, nil
		case "error":
			b, _ := base64.StdEncoding.DecodeString(ev.Data)
			return nil, &Error{Status: 502, Code: CodeSandboxUnreachable, Message: string(b)}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("exec stream: %w", err)
	}
	return nil, &Error{Status: 502, Code: CodeStreamEnded, Message: "the exec stream ended before the command did"}
}

// Images lists cached images.
func (c *Client) Images(ctx context.Context) ([]Image, error) {
	var out struct {
		Images []Image `json:"images"`
	}
	err := c.call(ctx, "GET", "/images", nil, &out)
	return out.Images, err
}

// Image returns one cached image.
func (c *Client) Image(ctx context.Context, ref string) (*Image, error) {
	var out Image
	if err := c.call(ctx, "GET", "/images/"+escRef(ref), nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Pull fetches an image into the server's cache, reporting progress.
func (c *Client) Pull(ctx context.Context, ref string, progress func(PullEvent)) (*Image, error) {
	resp, err := c.do(ctx, "POST", "/images/pull", PullRequest{Image: ref})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var ev PullEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return nil, fmt.Errorf("pull stream: %w", err)
		}
		switch ev.Type {
		case "progress":
			if progress != nil {
				progress(ev)
			}
		case "done":
			return ev.Image, nil
		case "error":
			ev.Error.Status = 0
			return nil, ev.Error
		}
	}
	return nil, fmt.Errorf("pull stream ended early: %v", sc.Err())
}

// RemoveImage deletes a cached image.
func (c *Client) RemoveImage(ctx context.Context, ref string) error {
	return c.call(ctx, "DELETE", "/images/"+escRef(ref), nil, nil)
}

// ImportImage uploads an OCI layout tarball or a docker-archive.
func (c *Client) ImportImage(ctx context.Context, r io.Reader, name string) ([]Image, error) {
	var out struct {
		Images []Image `json:"images"`
	}
	err := c.call(ctx, "POST", "/images/import?name="+url.QueryEscape(name), r, &out)
	return out.Images, err
}

// Fork copies a running sandbox (files, memory and processes) into a new
// running sandbox with its own id, name and address.
func (c *Client) Fork(ctx context.Context, idOrName string, req ForkRequest) (*Sandbox, error) {
	if req.Count > 1 {
		return nil, fmt.Errorf("Fork makes one sandbox: use ForkMany for count %d", req.Count)
	}
	var out Sandbox
	if err := c.call(ctx, "POST", "/sandboxes/"+esc(idOrName)+"/fork", req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ForkMany makes req.Count forks from one freeze of the source.
func (c *Client) ForkMany(ctx context.Context, idOrName string, req ForkRequest) ([]Sandbox, error) {
	if req.Count <= 1 {
		sb, err := c.Fork(ctx, idOrName, req)
		if err != nil {
			return nil, err
		}
		return []Sandbox{*sb}, nil
	}
	var out ForkResponse
	if err := c.call(ctx, "POST", "/sandboxes/"+esc(idOrName)+"/fork", req, &out); err != nil {
		return nil, err
	}
	return out.Sandboxes, nil
}

// Checkpoint saves a running sandbox's memory, processes and files without
// stopping it (it freezes for a moment), and records
// sandbox.checkpoint_created in its ledger session.
func (c *Client) Checkpoint(ctx context.Context, sandbox string, req CheckpointRequest) (*Checkpoint, error) {
	var out Checkpoint
	if err := c.call(ctx, "POST", "/sandboxes/"+esc(sandbox)+"/checkpoints", req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Checkpoints lists the checkpoints of one sandbox (id or name) or of one
// ledger session (its name), also after the sandbox is gone.
func (c *Client) Checkpoints(ctx context.Context, sandboxOrSession string) ([]Checkpoint, error) {
	var out struct {
		Checkpoints []Checkpoint `json:"checkpoints"`
	}
	err := c.call(ctx, "GET", "/sandboxes/"+esc(sandboxOrSession)+"/checkpoints", nil, &out)
	return out.Checkpoints, err
}

// AllCheckpoints lists every checkpoint on the server: taken by hand, by
// forks, and the environments'.
func (c *Client) AllCheckpoints(ctx context.Context) ([]Checkpoint, error) {
	var out struct {
		Checkpoints []Checkpoint `json:"checkpoints"`
	}
	err := c.call(ctx, "GET", "/checkpoints", nil, &out)
	return out.Checkpoints, err
}

// GetCheckpoint returns one checkpoint by id.
func (c *Client) GetCheckpoint(ctx context.Context, id string) (*Checkpoint, error) {
	var out Checkpoint
	if err := c.call(ctx, "GET", "/checkpoints/"+esc(id), nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// RemoveCheckpoint deletes a checkpoint and its files. One an environment
// uses is refused (409 checkpoint_in_use).
func (c *Client) RemoveCheckpoint(ctx context.Context, id string) error {
	return c.call(ctx, "DELETE", "/checkpoints/"+esc(id), nil, nil)
}

// RestoreCheckpoint starts a new sandbox from a checkpoint (the API's
// restoreCheckpoint; the product spec calls it restoreSnapshot): memory,
// processes and files as they were, with a new id, its own ledger session
// and a clean exec history; nothing is replayed (see Resume for that).
func (c *Client) RestoreCheckpoint(ctx context.Context, checkpointID string, req RestoreRequest) (*Sandbox, error) {
	var out Sandbox
	if err := c.call(ctx, "POST", "/checkpoints/"+esc(checkpointID)+"/restore", req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Restore is RestoreCheckpoint under its first name.
//
// Deprecated: call RestoreCheckpoint, the name every client uses.
func (c *Client) Restore(ctx context.Context, checkpointID string, req RestoreRequest) (*Sandbox, error) {
	return c.RestoreCheckpoint(ctx, checkpointID, req)
}

// CreateSnapshot saves the files of a stopped sandbox as a snapshot, which
// creates can start from (CreateRequest.FromSnapshot).
func (c *Client) CreateSnapshot(ctx context.Context, req SnapshotRequest) (*Snapshot, error) {
	var out Snapshot
	if err := c.call(ctx, "POST", "/snapshots", req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Snapshots lists every snapshot.
func (c *Client) Snapshots(ctx context.Context) ([]Snapshot, error) {
	var out struct {
		Snapshots []Snapshot `json:"snapshots"`
	}
	err := c.call(ctx, "GET", "/snapshots", nil, &out)
	return out.Snapshots, err
}

// GetSnapshot returns one snapshot by id or name.
func (c *Client) GetSnapshot(ctx context.Context, idOrName string) (*Snapshot, error) {
	var out Snapshot
	if err := c.call(ctx, "GET", "/snapshots/"+esc(idOrName), nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// RemoveSnapshot deletes a snapshot.
func (c *Client) RemoveSnapshot(ctx context.Context, idOrName string) error {
	return c.call(ctx, "DELETE", "/snapshots/"+esc(idOrName), nil, nil)
}

// Sessions lists the ledger's sessions, those of removed sandboxes too.
func (c *Client) Sessions(ctx context.Context) ([]Session, error) {
	var out struct {
		Sessions []Session `json:"sessions"`
	}
	err := c.call(ctx, "GET", "/ledger/sessions", nil, &out)
	return out.Sessions, err
}

// RemoveSession removes a ledger session and its events. The server
// refuses (409) while the session's sandbox exists or it has checkpoints.
func (c *Client) RemoveSession(ctx context.Context, name string) error {
	return c.call(ctx, "DELETE", "/ledger/sessions/"+esc(name), nil, nil)
}

// GetSession returns one ledger session by name.
func (c *Client) GetSession(ctx context.Context, name string) (*Session, error) {
	var out Session
	if err := c.call(ctx, "GET", "/ledger/sessions/"+esc(name), nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Events returns a page of a session's events: those with a sequence
// number above after, at most limit of them (0: the server's default).
// Pass the page's Next as after for the next page, while More is true.
func (c *Client) Events(ctx context.Context, session string, after int64, limit int) (*EventPage, error) {
	q := url.Values{"after": {strconv.FormatInt(after, 10)}}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var out EventPage
	if err := c.call(ctx, "GET", "/ledger/sessions/"+esc(session)+"/events?"+q.Encode(), nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// FollowEvents calls fn with each event of a session after the sequence
// number after: those already recorded, then each new one as it is
// recorded. It returns nil when the server ends the stream (the session's
// sandbox was removed), ctx's error when ctx ends, and fn's error as soon
// as fn returns one. No timeout applies: the client has none of its own,
// so the stream lasts as long as ctx.
func (c *Client) FollowEvents(ctx context.Context, session string, after int64, fn func(Event) error) error {
	q := url.Values{"after": {strconv.FormatInt(after, 10)}, "follow": {"true"}}
	resp, err := c.do(ctx, "GET", "/ledger/sessions/"+esc(session)+"/events?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue // a keep-alive
		}
		var ev Event
		if err := json.Unmarshal(line, &ev); err != nil {
			return fmt.Errorf("event stream: %w", err)
		}
		if err := fn(ev); err != nil {
			return err
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("event stream: %w", err)
	}
	return nil
}

// Resume recreates a sandbox from a ledger session: from the session's
// latest checkpoint (or its first create), then it replays, in order, the
// execs the ledger recorded after that. The new sandbox has a new id and
// its own session; the answer says what was replayed and how it exited.
func (c *Client) Resume(ctx context.Context, session string, req ResumeRequest) (*ResumeResponse, error) {
	var out ResumeResponse
	if err := c.call(ctx, "POST", "/ledger/sessions/"+esc(session)+"/resume", req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// CreateEnvironment builds a named environment, or leaves it as it is when
// one of that name has the same fingerprint. BuildEnvironment also tells
// which of the two happened.
func (c *Client) CreateEnvironment(ctx context.Context, req EnvironmentRequest) (*Environment, error) {
	env, _, err := c.BuildEnvironment(ctx, req)
	return env, err
}

// BuildEnvironment is CreateEnvironment, and also reports whether the
// environment was built (201) or already there with the same fingerprint
// and left unchanged (200).
func (c *Client) BuildEnvironment(ctx context.Context, req EnvironmentRequest) (env *Environment, built bool, err error) {
	resp, err := c.do(ctx, "POST", "/environments", req)
	if err != nil {
		return nil, false, err
	}
	defer resp.Body.Close()
	var out Environment
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, false, fmt.Errorf("decode the server's answer: %w", err)
	}
	return &out, resp.StatusCode == http.StatusCreated, nil
}

// Environments lists every environment.
func (c *Client) Environments(ctx context.Context) ([]Environment, error) {
	var out struct {
		Environments []Environment `json:"environments"`
	}
	err := c.call(ctx, "GET", "/environments", nil, &out)
	return out.Environments, err
}

// GetEnvironment returns one environment by name.
func (c *Client) GetEnvironment(ctx context.Context, name string) (*Environment, error) {
	var out Environment
	if err := c.call(ctx, "GET", "/environments/"+esc(name), nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// RemoveEnvironment deletes an environment.
func (c *Client) RemoveEnvironment(ctx context.Context, name string) error {
	return c.call(ctx, "DELETE", "/environments/"+esc(name), nil, nil)
}

// DiskUsage says what images, sandboxes, snapshots, checkpoints and
// environments hold on the server's disk.
func (c *Client) DiskUsage(ctx context.Context) (*DiskUsage, error) {
	var out DiskUsage
	if err := c.call(ctx, "GET", "/system/df", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Projects lists the projects that hold anything (a project's key: its
// own).
func (c *Client) Projects(ctx context.Context) ([]Project, error) {
	var out struct {
		Projects []Project `json:"projects"`
	}
	err := c.call(ctx, "GET", "/projects", nil, &out)
	return out.Projects, err
}

// SetProjectQuota sets project name's quota, replacing the one it had (the
// zero ProjectQuota removes every bound): PUT /v0/projects/{name}/quota,
// which takes a key of every project with the scope "*" (or the socket).
func (c *Client) SetProjectQuota(ctx context.Context, name string, q ProjectQuota) (*Project, error) {
	var out Project
	if err := c.call(ctx, "PUT", "/projects/"+url.PathEscape(name)+"/quota", q, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// CreateToken makes an API key with the given scopes (POST /v0/tokens). The
// answer's Key is shown this once: the server keeps only its hash. Creating
// tokens needs token:write (the Unix socket, the administrator, has every
// scope).
func (c *Client) CreateToken(ctx context.Context, req TokenRequest) (*TokenCreated, error) {
	var out TokenCreated
	if err := c.call(ctx, "POST", "/tokens", req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Tokens lists every API key's record: id, name, scopes, never the key.
func (c *Client) Tokens(ctx context.Context) ([]Token, error) {
	var out struct {
		Tokens []Token `json:"tokens"`
	}
	err := c.call(ctx, "GET", "/tokens", nil, &out)
	return out.Tokens, err
}

// Nodes lists the nodes of the cluster the server belongs to (409
// not_clustered from a single host).
func (c *Client) Nodes(ctx context.Context) ([]Node, error) {
	var out struct {
		Nodes []Node `json:"nodes"`
	}
	err := c.call(ctx, "GET", "/nodes", nil, &out)
	return out.Nodes, err
}

// ServerVersion is GET /v0/version: the server's build and API version
// (no key needed).
func (c *Client) ServerVersion(ctx context.Context) (*Version, error) {
	var out Version
	if err := c.call(ctx, "GET", "/version", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Whoami tells who the client's key is: its name, project and scopes.
func (c *Client) Whoami(ctx context.Context) (*Whoami, error) {
	var out Whoami
	if err := c.call(ctx, "GET", "/whoami", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// RevokeToken deletes an API key by its id or name; the key stops working
// at once.
func (c *Client) RevokeToken(ctx context.Context, idOrName string) error {
	return c.call(ctx, "DELETE", "/tokens/"+esc(idOrName), nil, nil)
}

// SetSecret stores value under name, replacing any value it had. The
// server keeps it encrypted and no endpoint ever returns it: the answer is
// the secret's record. Sandboxes get it through grants (Grant).
func (c *Client) SetSecret(ctx context.Context, name string, value []byte) (*Secret, error) {
	var out Secret
	if err := c.call(ctx, "PUT", "/secrets/"+esc(name), SecretRequest{Value: value}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Secrets lists the stored secrets: names and times, never values.
func (c *Client) Secrets(ctx context.Context) ([]Secret, error) {
	var out struct {
		Secrets []Secret `json:"secrets"`
	}
	err := c.call(ctx, "GET", "/secrets", nil, &out)
	return out.Secrets, err
}

// RemoveSecret deletes a secret. Sandboxes it was granted to keep a file
// already written; an env grant gives nothing to later execs.
func (c *Client) RemoveSecret(ctx context.Context, name string) error {
	return c.call(ctx, "DELETE", "/secrets/"+esc(name), nil, nil)
}

// Grant gives a secret to a sandbox: as the environment variable g.Env of
// every later exec (the secret's name when both Env and File are empty), or
// as the file g.File (mode 0400, written at once; the sandbox must be
// running). Granting the same secret again replaces its grant. The answer
// is the sandbox, with its grants.
func (c *Client) Grant(ctx context.Context, sandbox string, g Grant) (*Sandbox, error) {
	var out Sandbox
	if err := c.call(ctx, "POST", "/sandboxes/"+esc(sandbox)+"/grants", g, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Grants lists a sandbox's grants (secret names, never values).
func (c *Client) Grants(ctx context.Context, sandbox string) ([]Grant, error) {
	var out struct {
		Grants []Grant `json:"grants"`
	}
	err := c.call(ctx, "GET", "/sandboxes/"+esc(sandbox)+"/grants", nil, &out)
	return out.Grants, err
}

// Ungrant takes a secret away from a sandbox: later execs no longer get its
// variable, and a granted file is removed (the sandbox must be running for
// that). The answer is the sandbox.
func (c *Client) Ungrant(ctx context.Context, sandbox, secret string) (*Sandbox, error) {
	var out Sandbox
	if err := c.call(ctx, "DELETE", "/sandboxes/"+esc(sandbox)+"/grants/"+esc(secret), nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// SetPolicy replaces a sandbox's egress network policy with p. It applies
// at once to new connections, is enforced outside the sandbox, and holds
// across stop and start; a fork gets a copy. The answer is the policy as
// stored.
func (c *Client) SetPolicy(ctx context.Context, sandbox string, p Policy) (*Policy, error) {
	var out Policy
	if err := c.call(ctx, "PUT", "/sandboxes/"+esc(sandbox)+"/policy", p, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// GetPolicy returns a sandbox's egress policy; an empty Policy means none:
// all egress is allowed.
func (c *Client) GetPolicy(ctx context.Context, sandbox string) (*Policy, error) {
	var out Policy
	if err := c.call(ctx, "GET", "/sandboxes/"+esc(sandbox)+"/policy", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ClearPolicy removes a sandbox's egress policy: all egress is allowed again.
func (c *Client) ClearPolicy(ctx context.Context, sandbox string) error {
	return c.call(ctx, "DELETE", "/sandboxes/"+esc(sandbox)+"/policy", nil, nil)
}

// portPrefix is the path, unescaped and escaped, ending in "/", under which
// the server forwards to port in sandbox.
func portPrefix(sandbox string, port int) (path, escaped string) {
	return "/v0/sandboxes/" + sandbox + "/ports/" + strconv.Itoa(port) + "/",
		"/v0/sandboxes/" + esc(sandbox) + "/ports/" + strconv.Itoa(port) + "/"
}

// PortURL is the URL at which the server forwards to port inside sandbox
// (a running one), with path (which may carry a ?query) after it:
// /v0/sandboxes/{id}/ports/{port}/{path}, every method and WebSocket
// upgrades included. Requests to it need this client's API key as
// Authorization: Bearer (a WebSocket upgrade may give it as
// ?access_token= instead); the server removes that header before it
// forwards, so the server in the sandbox never sees it.
//
// Over the Unix socket the URL's host is a placeholder ("shard"): the URL
// is usable only through a connection to the socket, which PortProxy (and
// `curl --unix-socket`) makes; an ordinary HTTP client cannot reach it.
func (c *Client) PortURL(sandbox string, port int, path string) string {
	prefix, escaped := portPrefix(sandbox, port)
	p, q, hasQuery := strings.Cut(strings.TrimPrefix(path, "/"), "?")
	u := url.URL{Path: prefix + p, RawPath: escaped + (&url.URL{Path: p}).EscapedPath()}
	if hasQuery {
		u.RawQuery = q
	}
	return c.base + u.String()
}

// PortProxy is an http.Handler that forwards every request it gets (any
// method, WebSocket upgrades too) to port inside sandbox, through the
// server: a request for /a/b?c=d goes to PortURL(sandbox, port, "a/b?c=d")
// over this client's own connection to the server (the Unix socket or
// TCP), with this client's API key as its Authorization header (any the
// request had is dropped: the server would strip it anyway). The path is
// cleaned first, so ".." cannot leave the port's prefix. When the server
// cannot be reached the answer is 502 with an Error body; the server's own
// errors (sandbox_not_running, port_unreachable, ...) pass through as they
// are.
//
// `shard port` serves it on a local address, so that a browser or any
// tool reaches a server in a sandbox as if it ran here.
func (c *Client) PortProxy(sandbox string, port int) http.Handler {
	base, _ := url.Parse(c.base) // New checked it
	prefix, escaped := portPrefix(sandbox, port)
	if err := checkPath(escaped); err != nil {
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			json.NewEncoder(w).Encode(err)
		})
	}
	return &httputil.ReverseProxy{
		Transport: c.hc.Transport,
		Rewrite: func(pr *httputil.ProxyRequest) {
			p := pr.In.URL.Path
			rel := path.Clean("/" + p)
			if strings.HasSuffix(p, "/") && rel != "/" {
				rel += "/"
			}
			pr.Out.URL.Scheme, pr.Out.URL.Host = base.Scheme, base.Host
			rel = strings.TrimPrefix(rel, "/")
			pr.Out.URL.Path, pr.Out.URL.RawPath = prefix+rel, escaped+(&url.URL{Path: rel}).EscapedPath()
			pr.Out.Host = "" // the server's host, not the one the request was sent to
			DropKey(pr.Out)
			pr.Out.Header.Del(ProjectHeader)
			c.authorize(pr.Out.Header)
		},
		ErrorHandler:  c.proxyError,
		FlushInterval: -1, // streams (server-sent events, long polls) as they come
	}
}

// ServerProxy is an http.Handler that forwards every request it gets to the
// server, path and query as they are (WebSocket upgrades too), over this
// client's own connection, with this client's API key: what the request
// brought as a key (its Authorization header, or ?access_token= of an
// upgrade) is dropped. A project the request names (Shard-Project, or
// ?project= of an upgrade) is kept; else this client's. The caller decides
// who may use it: `shard ui` lets through only requests that carry its
// session's own key.
func (c *Client) ServerProxy() http.Handler {
	base, _ := url.Parse(c.base) // New checked it
	return &httputil.ReverseProxy{
		Transport: c.hc.Transport,
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = base.Scheme, base.Host
			pr.Out.Host = ""
			DropKey(pr.Out)
			proj := pr.In.Header.Get(ProjectHeader)
			c.authorize(pr.Out.Header)
			if proj != "" {
				pr.Out.Header.Set(ProjectHeader, proj)
			}
		},
		ErrorHandler:  c.proxyError,
		FlushInterval: -1, // streams (exec output, a followed ledger) as they come
	}
}

// proxyError answers a proxied request the server could not be reached for.
func (c *Client) proxyError(w http.ResponseWriter, _ *http.Request, err error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusBadGateway)
	json.NewEncoder(w).Encode(&Error{Code: CodeServerUnreachable, Message: c.connErr(err).Error()})
}
