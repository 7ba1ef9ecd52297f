// Package integration drives a real `shard serve` with real runsc and runc,
// a real local OCI registry (Debian's docker-registry) with images built
// from Debian packages, real network namespaces and nftables.
//
// These tests need root and the runtimes. Plain `go test ./...` skips them;
// set SHARD_INTEGRATION=1 (the README's test command and CI do) and then a
// missing runtime or tool fails loudly instead of skipping.
package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/testenv"
)

// env is the one server and registry every test shares.
type env struct {
	root     string // repository root
	bin      string // the shard binary under test
	dir      string // temp dir of the run
	registry string // 127.0.0.1:port
	socket   string
	dataDir  string
	runDir   string
	bridge   string
	subnet   string
	server   *exec.Cmd
	serveLog string
	tcp      string // the server's TCP address (--listen): API keys needed there
	metrics  string // --metrics-listen: GET /metrics without a key
	extra    []string
	c        *client.Client
}

var E *env

// closeInherited marks every descriptor this process inherited (beyond
// stdin, stdout and stderr) close-on-exec: a lock held by the command
// that started the tests (flock's) would otherwise pass to the server and
// registry the tests start, and outlive a run that a timeout ended, which
// runs no teardown.
func closeInherited() {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, d := range ents {
		if fd, err := strconv.Atoi(d.Name()); err == nil && fd > 2 {
			syscall.CloseOnExec(fd)
		}
	}
}

func TestMain(m *testing.M) {
	if !testenv.Strict() {
		fmt.Println("integration tests need root, runsc and runc: set SHARD_INTEGRATION=1 to run them")
		os.Exit(m.Run()) // every test skips itself
	}
	closeInherited()
	e, err := setup()
	if err != nil {
		fmt.Fprintln(os.Stderr, "integration setup failed:", err)
		if e != nil {
			e.teardown()
		}
		os.Exit(1)
	}
	E = e
	code := m.Run()
	e.teardown()
	os.Exit(code)
}

func need(t testing.TB) *env {
	t.Helper()
	if E == nil { // only without SHARD_INTEGRATION=1: with it, setup failing ends the run
		t.Skip("set SHARD_INTEGRATION=1 to run integration tests")
	}
	return E
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func run(name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

func setup() (*env, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("integration tests must run as root")
	}
	for _, tool := range []string{"runsc", "runc", "docker-registry", "skopeo", "umoci", "mkfs.xfs", "mkfs.ext4"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("%s is not installed: run scripts/install-deps.sh", tool)
		}
	}
	_, file, _, _ := runtime.Caller(0)
	e := &env{root: filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))}
	dir, err := os.MkdirTemp("", "shard-it-")
	if err != nil {
		return nil, err
	}
	e.dir = dir
	e.bin = filepath.Join(dir, "shard")
	// Built as a newcomer builds it, a plain go build: with cgo where a C
	// compiler is (cmd/shard/static.go links it statically then), so
	// every test runs that binary as the sandboxes' agent.
	build := exec.Command("go", "build", "-o", e.bin, "./cmd/shard")
	build.Dir = e.root
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CGO_ENABLED=") {
			build.Env = append(build.Env, kv)
		}
	}
	if prebuilt := os.Getenv("SHARD_IT_BIN"); prebuilt != "" {
		// A benchmark of an older build against this one (BenchmarkExecTrue
		// before and after a change): the tests themselves always build.
		build = exec.Command("cp", prebuilt, e.bin)
	}
	if out, err := build.CombinedOutput(); err != nil {
		return e, fmt.Errorf("build shard: %v\n%s", err, out)
	}
	port, err := freePort()
	if err != nil {
		return e, err
	}
	e.registry = fmt.Sprintf("127.0.0.1:%d", port)
	if _, err := run(filepath.Join(e.root, "scripts", "registry.sh"), "start", filepath.Join(dir, "registry"), fmt.Sprint(port)); err != nil {
		return e, err
	}
	if _, err := run(filepath.Join(e.root, "scripts", "test-images.sh"), e.registry); err != nil {
		return e, err
	}
	e.socket = filepath.Join(dir, "shard.sock")
	e.dataDir = filepath.Join(dir, "data")
	e.runDir = filepath.Join(dir, "run")
	// A bridge and subnet of their own, so a shard serve on this machine
	// (the default shard0, 10.88/16) is not disturbed.
	// SHARD_IT_BRIDGE and SHARD_IT_SUBNET let two runs share a machine
	// (and SHARD_IT_STORAGE_SIZE and SHARD_IT_STORAGE_MAX, the store's
	// first size and the most it grows to: 1GiB and 8GiB).
	e.bridge = envOr("SHARD_IT_BRIDGE", "shardit0")
	e.subnet = envOr("SHARD_IT_SUBNET", "10.89.0.0/16")
	// Another run's server on this bridge (it holds the bridge's lock, as
	// every shard serve does): its veths and, at teardown, its bridge
	// and tables are not ours to clear.
	if busy, err := bridgeLocked(e.bridge); err != nil || busy {
		b := e.bridge
		e.bridge = ""
		if err != nil {
			return e, fmt.Errorf("bridge %s: its lock: %w", b, err)
		}
		return e, fmt.Errorf("bridge %s is a running shard serve's (another test run?): wait for it, or set SHARD_IT_BRIDGE and SHARD_IT_SUBNET", b)
	}
	// A run that was killed leaves its veths on the test bridge, holding
	// addresses this run will hand out again: clear them first.
	if out, err := exec.Command("ip", "-o", "link", "show", "master", e.bridge).Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			if f := strings.Fields(line); len(f) > 1 {
				name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
				exec.Command("ip", "link", "del", name).Run()
			}
		}
	}
	if err := e.startServer(); err != nil {
		return e, err
	}
	return e, nil
}

// startServer starts `shard serve` (e.bin) with the test's flags plus extra.
func (e *env) startServer(extra ...string) error {
	e.serveLog = filepath.Join(e.dir, "serve.log")
	if e.tcp == "" {
		port, err := freePort()
		if err != nil {
			return err
		}
		e.tcp = fmt.Sprintf("127.0.0.1:%d", port)
	}
	if e.metrics == "" && os.Getenv("SHARD_IT_BIN") == "" { // an older build may not have the flag
		port, err := freePort()
		if err != nil {
			return err
		}
		e.metrics = fmt.Sprintf("127.0.0.1:%d", port)
	}
	logf, err := os.OpenFile(e.serveLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	args := append(e.serveArgs(e.socket, e.dataDir, e.runDir, e.bridge, e.subnet, envOr("SHARD_IT_STORAGE_SIZE", "1GiB"), envOr("SHARD_IT_STORAGE_MAX", "8GiB")),
		"--listen", e.tcp)
	if e.metrics != "" {
		args = append(args, "--metrics-listen", e.metrics)
	}
	args = append(args, e.extra...)
	cmd := exec.Command(e.bin, append(args, extra...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Env = serverEnv()
	if err := cmd.Start(); err != nil {
		return err
	}
	e.server = cmd
	c, err := client.New(client.Options{Socket: e.socket})
	if err != nil {
		return err
	}
	e.c = c
	return waitServing(c, cmd, e.serveLog)
}

// killServer kills the server with SIGKILL (kill -9): no clean-up at all.
func (e *env) killServer() {
	e.server.Process.Signal(syscall.SIGKILL)
	e.server.Wait()
}

func (e *env) stopServer() {
	if e.server == nil || e.server.Process == nil {
		return
	}
	e.server.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { e.server.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		e.server.Process.Kill()
		<-done
	}
}

func (e *env) teardown() {
	if e.c != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		if all, err := e.c.List(ctx); err == nil {
			for _, sb := range all {
				e.c.Remove(ctx, sb.ID, true)
			}
		}
		cancel()
	}
	e.stopServer()
	// The server's log outlives the run's directory, for a failure's
	// post-mortem.
	if e.serveLog != "" {
		if b, err := os.ReadFile(e.serveLog); err == nil {
			os.WriteFile(filepath.Join(os.TempDir(), "shard-it-serve.log"), b, 0o644)
		}
	}
	// Whatever a failed test or benchmark left running under our roots
	// (the server's and the raw runs'), so nothing outlives the run.
	for _, rt := range [][2]string{
		{"runsc", filepath.Join(e.runDir, "runsc")}, {"runsc", filepath.Join(e.dir, "rawrunsc")},
		{"runc", filepath.Join(e.runDir, "runc")}, {"runc", filepath.Join(e.dir, "rawrunc")},
	} {
		for _, id := range runtimeIDs(rt[0], rt[1]) {
			exec.Command(rt[0], "--root", rt[1], "delete", "--force", id).Run()
		}
	}
	var under []string
	for _, m := range mounts() {
		if strings.HasPrefix(m.point, e.dir+"/") {
			under = append(under, m.point)
		}
	}
	for i := len(under) - 1; i >= 0; i-- { // deepest first
		exec.Command("umount", "-l", under[i]).Run()
	}
	run(filepath.Join(e.root, "scripts", "registry.sh"), "stop", filepath.Join(e.dir, "registry"))
	exec.Command("umount", filepath.Join(e.dataDir, "storage")).Run()
	if e.bridge != "" {
		exec.Command("ip", "link", "del", e.bridge).Run()
		exec.Command("nft", "delete", "table", "ip", e.bridge).Run()
		exec.Command("nft", "delete", "table", "bridge", e.bridge).Run()
	}
	if os.Getenv("SHARD_KEEP") == "" {
		os.RemoveAll(e.dir)
	} else {
		fmt.Println("kept", e.dir)
	}
}

// bridgeLocked reports whether a shard serve holds bridge's lock (the file
// cmd/shard's daemon takes for it, in /run/lock).
func bridgeLocked(bridge string) (bool, error) {
	f, err := os.OpenFile(filepath.Join("/run/lock", "shard-bridge-"+bridge+".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return false, err
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return true, nil
		}
		return false, err
	}
	return false, nil // closing the file lets go of the lock
}

// cli runs the shard CLI against the test server.
func (e *env) cli(t testing.TB, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	// Bounded, so that a CLI that hangs fails its test, not the suite's
	// whole run at its timeout.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, e.bin, append([]string{"--socket", e.socket}, args...)...)
	cmd.WaitDelay = 10 * time.Second
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var o, er bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &er
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("shard %v: no exit in 5m (killed); stdout %q, stderr %q", args, o.String(), er.String())
	}
	code = 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("run shard %v: %v", args, err)
		}
		code = ee.ExitCode()
	}
	return o.String(), er.String(), code
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// image names in the local registry, reached through the mirror as docker
// would name them on a machine with internet.
const (
	busybox = "busybox"
	python  = "python:3.12-slim"
)

var providers = []string{"gvisor", "runc"}

// create makes a sandbox and removes it when the test ends.
func create(t testing.TB, req client.CreateRequest) *client.Sandbox {
	t.Helper()
	e := need(t)
	sb, err := e.c.Create(ctxT(t), req)
	if err != nil {
		t.Fatalf("create %+v: %v", req, err)
	}
	t.Cleanup(func() { e.c.Remove(context.Background(), sb.ID, true) })
	return sb
}

func execOK(t testing.TB, id string, argv ...string) string {
	t.Helper()
	res, err := need(t).c.Exec(ctxT(t), id, client.ExecRequest{Argv: argv})
	if err != nil {
		t.Fatalf("exec %v in %s: %v", argv, id, err)
	}
	if res.ExitCode != 0 {
		t.Fatalf("exec %v in %s: exit %d, stderr %q", argv, id, res.ExitCode, res.Stderr)
	}
	return string(res.Stdout)
}

func mustCreate(image, name string) client.CreateRequest {
	return client.CreateRequest{Image: image, Name: name}
}

// restartWith restarts the shared server with extra flags (kept by any
// restart the test makes, e.startServer's), and at the test's end with its
// usual ones again.
func restartWith(t testing.TB, extra ...string) {
	t.Helper()
	e := need(t)
	e.stopServer()
	e.extra = extra
	if err := e.startServer(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.stopServer()
		e.extra = nil
		if err := e.startServer(); err != nil {
			t.Fatal(err)
		}
	})
}

// mount is one line of /proc/self/mountinfo: where, with which options.
type mount struct {
	point string // the mount point (field 5)
	opts  string // the per-mount options (field 6)
	line  string // the whole line, for messages and super options
}

// mounts reads /proc/self/mountinfo.
func mounts() []mount {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	var out []mount
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 5 {
			out = append(out, mount{point: f[4], opts: f[5], line: l})
		}
	}
	return out
}

// sandboxMounts are the mounts under e's data and run directories that a
// sandbox holds: all of them but the store itself and runsc's empty
// network namespace for gofers (pinned once per root, no sandbox's).
func (e *env) sandboxMounts() []string {
	var out []string
	for _, m := range mounts() {
		if m.point == filepath.Join(e.dataDir, "storage") || m.point == filepath.Join(e.runDir, "runsc", "null-netns") {
			continue
		}
		if strings.HasPrefix(m.point, e.dataDir+"/") || strings.HasPrefix(m.point, e.runDir+"/") {
			out = append(out, m.point)
		}
	}
	return out
}

// serveArgs are the flags every test server starts with: directories of its
// own under dir (the shared server's are e's), its own bridge and subnet,
// the test registry as the mirror, a small store, small default disks.
func (e *env) serveArgs(socket, dataDir, runDir, bridge, subnet, storeSize, storeMax string) []string {
	args := []string{"serve", "--socket", socket, "--data-dir", dataDir, "--run-dir", runDir,
		"--bridge", bridge, "--subnet", subnet, "--storage-size", storeSize, "--default-disk", "256MiB",
		"--registry-mirror", "http://" + e.registry, "--insecure-registry", e.registry, "--stop-timeout", "3s", "--log-level", "debug"}
	if storeMax != "" {
		args = append(args, "--storage-max", storeMax)
	}
	if os.Getenv("SHARD_IT_BIN") == "" { // an older build may not have the flag
		// No sandboxes made ahead but where a test asks for them
		// (restartWith "--ahead"): the tests' leak checks count every
		// runtime container, mount and namespace as some record's.
		args = append(args, "--ahead", "0")
	}
	return args
}

// waitServing waits up to a minute for a server started as cmd to answer
// c, and says why not with its log.
func waitServing(c *client.Client, cmd *exec.Cmd, log string) error {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := c.Capabilities(ctx)
		cancel()
		if err == nil {
			return nil
		}
		if cmd.ProcessState != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	b, _ := os.ReadFile(log)
	return fmt.Errorf("shard serve did not come up:\n%s", b)
}

// serverEnv is the environment of the servers the tests start: a path that
// loses a request's project panics there (internal/project), as in a unit
// test, instead of quietly seeing nothing.
func serverEnv() []string { return append(os.Environ(), "SHARD_STRICT_PROJECTS=1") }

// runtimeIDs lists the containers runtime (runsc or runc) holds under
// root, by its JSON list (runsc has no -q: a list -q that failed quietly
// left a cluster test's sandboxes running, their stores held, after it).
func runtimeIDs(runtime, root string) []string {
	out, _ := exec.Command(runtime, "--root", root, "list", "--format", "json").Output()
	var sts []struct{ ID string }
	json.Unmarshal(out, &sts)
	ids := make([]string, 0, len(sts))
	for _, st := range sts {
		ids = append(ids, st.ID)
	}
	return ids
}
