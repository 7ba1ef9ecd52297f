package integration

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
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
	"github.com/useshards/shard/client"
)

// The README and docs/ show commands; TestDocCommands runs every one of them
// against the test server, so the documents cannot drift from the product.
//
// A fenced block whose info string is exactly `sh` is run: each document's
// blocks in order, each by `bash -euo pipefail`, in a directory of the
// document's own, with the test's shard first on PATH, reaching the test
// server over TCP with an administrator's key, in a project of the
// document's own (SHARD_PROJECT=docs-NAME), which is emptied afterwards.
// A block that cannot run as written here (a real cluster's addresses, a
// terminal, the test suite itself) says which test runs it instead:
// ```sh run-by=TestName (or the script that does: run-by=.ci/run), and that
// test or script must exist. `sh tty` runs a block on a terminal that types
// `exit` (shard exec -it), and `sh interrupt` one whose last command runs
// until Ctrl-C (shard port, shard ui, --follow): it must be still running
// once it has printed a line, and end on SIGINT. Anything else (`text`
// for output, `ts`, `python`, `go`) is not a command.

// docFence is the opening line of a fenced block: its language and the rest.
var docFence = regexp.MustCompile("^```([A-Za-z0-9_-]*)[ \t]*(.*)$")

// docProject finds the projects a block's commands name.
var docProject = regexp.MustCompile(`--project[ =]([a-z0-9][a-z0-9_.-]*)`)

type docBlock struct {
	file  string
	line  int    // of the opening fence
	runBy string // the test that runs it instead, or ""
	// mode is how it runs: "" to its end, "tty" on a terminal that types
	// `exit`, "interrupt" until its last command serves (prints a line),
	// then Ctrl-C, as a user ends `shard port` or `shard ledger --follow`.
	mode string
	body string
}

// docBlocks returns the sh blocks of one markdown file.
func docBlocks(path string) ([]docBlock, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var (
		blocks []docBlock
		cur    *docBlock
		lang   string
		body   strings.Builder
	)
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if cur == nil && lang == "" {
			m := docFence.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			lang = m[1]
			if lang == "" {
				lang = "text"
			}
			if lang != "sh" {
				continue
			}
			cur = &docBlock{file: path, line: n}
			switch attr := strings.TrimSpace(m[2]); {
			case attr == "":
			case strings.HasPrefix(attr, "run-by="):
				cur.runBy = strings.TrimPrefix(attr, "run-by=")
			case attr == "tty" || attr == "interrupt":
				cur.mode = attr
			default:
				return nil, fmt.Errorf("%s:%d: a sh block's info string is `sh`, `sh tty`, `sh interrupt` or `sh run-by=TestName`, not %q", path, n, line)
			}
			body.Reset()
			continue
		}
		if strings.HasPrefix(line, "```") {
			if cur != nil {
				cur.body = body.String()
				blocks = append(blocks, *cur)
			}
			cur, lang = nil, ""
			continue
		}
		if cur != nil {
			body.WriteString(line)
			body.WriteByte('\n')
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if lang != "" {
		return nil, fmt.Errorf("%s: a fenced block is not closed", path)
	}
	return blocks, nil
}

// docFiles are the documents whose commands are run.
func docFiles(root string) ([]string, error) {
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		return nil, err
	}
	return append([]string{filepath.Join(root, "README.md")}, docs...), nil
}

// testNames are the Test and Benchmark functions of this package.
func testNames(t *testing.T, dir string) map[string]bool {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`(?m)^func ((?:Test|Benchmark)[A-Za-z0-9_]*)\(`)
	names := map[string]bool{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range re.FindAllStringSubmatch(string(b), -1) {
			names[m[1]] = true
		}
	}
	return names
}

// TestDocsShape checks what needs no server: every sh block is run here or
// names a test that exists, and the README stays a page (two screens).
func TestDocsShape(t *testing.T) {
	root := repoRoot(t)
	files, err := docFiles(root)
	if err != nil {
		t.Fatal(err)
	}
	names := testNames(t, filepath.Join(root, "test", "integration"))
	run, delegated := 0, 0
	for _, f := range files {
		blocks, err := docBlocks(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range blocks {
			if b.runBy == "" {
				run++
				continue
			}
			delegated++
			if _, err := os.Stat(filepath.Join(root, b.runBy)); !names[b.runBy] && err != nil {
				t.Errorf("%s:%d: run-by=%s: no such test in test/integration, nor script in the repository", rel(root, b.file), b.line, b.runBy)
			}
		}
	}
	t.Logf("%d sh blocks run by TestDocCommands, %d by the tests they name", run, delegated)
	if run == 0 {
		t.Error("no sh block found to run: the parser or the docs are wrong")
	}
	// Links between the documents lead somewhere (the moves into docs/
	// changed every relative path once).
	link := regexp.MustCompile(`\]\(([^)#\s]+)(#[^)]*)?\)`)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(string(b), -1) {
			if strings.Contains(m[1], "://") || strings.HasPrefix(m[1], "mailto:") {
				continue
			}
			if _, err := os.Stat(filepath.Join(filepath.Dir(f), m[1])); err != nil {
				t.Errorf("%s: a link to %s leads nowhere", rel(root, f), m[1])
			}
		}
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(readme), "\n"); n > 120 {
		t.Errorf("README.md has %d lines: a newcomer's page is at most 120 (two screens); move the rest into docs/", n)
	}
}

func TestDocCommands(t *testing.T) {
	e := need(t)
	root := repoRoot(t)
	files, err := docFiles(root)
	if err != nil {
		t.Fatal(err)
	}
	key := adminKey(t, e)
	bin := filepath.Join(e.dir, "docs-bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(e.bin, filepath.Join(bin, "shard")); err != nil && !os.IsExist(err) {
		t.Fatal(err)
	}
	for _, f := range files {
		blocks, err := docBlocks(f)
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimSuffix(filepath.Base(f), ".md")
		t.Run(name, func(t *testing.T) {
			project := "docs-" + strings.ToLower(name)
			// The document's own project, and those its commands name.
			projects := []string{project}
			for _, b := range blocks {
				for _, m := range docProject.FindAllStringSubmatch(b.body, -1) {
					projects = append(projects, m[1])
				}
			}
			for _, p := range projects {
				emptyProject(t, e, p)
				t.Cleanup(func() { emptyProject(t, e, p) })
			}
			// Keys of every project it made (a scraper's) go too.
			before := tokenIDs(t, e)
			t.Cleanup(func() {
				for id := range tokenIDs(t, e) {
					if !before[id] {
						e.c.RevokeToken(context.Background(), id)
					}
				}
			})
			dir := t.TempDir()
			env := append(os.Environ(),
				"PATH="+bin+":"+os.Getenv("PATH"),
				"SHARD_REMOTE=http://"+e.tcp,
				"SHARD_API_KEY="+key,
				"SHARD_PROJECT="+project,
				"HOME="+dir,
			)
			for _, b := range blocks {
				if b.runBy != "" {
					continue
				}
				out, err := runDocBlock(b, dir, env)
				t.Logf("%s:%d:\n%s", rel(root, b.file), b.line, out)
				if err != nil {
					t.Fatalf("%s:%d: %v\n--- block\n%s--- output\n%s", rel(root, b.file), b.line, err, b.body, out)
				}
			}
		})
	}
}

func repoRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		t.Fatalf("go list -m: %v", err)
	}
	return strings.TrimSpace(string(out))
}

func rel(root, path string) string {
	if r, err := filepath.Rel(root, path); err == nil {
		return r
	}
	return path
}

// adminKey makes a key of every project with every scope, as an operator
// would for themselves.
func adminKey(t *testing.T, e *env) string {
	t.Helper()
	tok, err := e.c.CreateToken(ctxT(t), client.TokenRequest{Name: fmt.Sprintf("docs-%d", time.Now().UnixNano()), Scopes: []string{"*"}, Project: "*"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.c.RevokeToken(context.Background(), tok.ID) })
	return tok.Key
}

// emptyProject removes what a document's commands made in its project.
func emptyProject(t *testing.T, e *env, project string) {
	t.Helper()
	c, err := client.New(client.Options{Socket: e.socket, Project: project})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	must := func(what string, err error) {
		var ce *client.Error
		if err != nil && !(errors.As(err, &ce) && ce.Status == 404) {
			t.Errorf("empty project %s: %s: %v", project, what, err)
		}
	}
	envs, err := c.Environments(ctx)
	must("list environments", err)
	for _, x := range envs {
		must("remove environment "+x.Name, c.RemoveEnvironment(ctx, x.Name))
	}
	sbs, err := c.List(ctx)
	must("list sandboxes", err)
	for _, x := range sbs {
		_, err := c.RemoveWith(ctx, x.ID, client.RemoveOptions{Force: true})
		must("remove sandbox "+x.Name, err)
	}
	cps, err := c.AllCheckpoints(ctx)
	must("list checkpoints", err)
	for _, x := range cps {
		must("remove checkpoint "+x.ID, c.RemoveCheckpoint(ctx, x.ID))
	}
	snaps, err := c.Snapshots(ctx)
	must("list snapshots", err)
	for _, x := range snaps {
		must("remove snapshot "+x.ID, c.RemoveSnapshot(ctx, x.ID))
	}
	secrets, err := c.Secrets(ctx)
	must("list secrets", err)
	for _, x := range secrets {
		must("remove secret "+x.Name, c.RemoveSecret(ctx, x.Name))
	}
	toks, err := c.Tokens(ctx)
	must("list tokens", err)
	for _, x := range toks {
		if x.Project == project {
			must("revoke token "+x.Name, c.RevokeToken(ctx, x.ID))
		}
	}
	sessions, err := c.Sessions(ctx)
	must("list sessions", err)
	for _, x := range sessions {
		must("remove session "+x.Name, c.RemoveSession(ctx, x.Name))
	}
}

// runDocBlock runs one block as its mode says, and returns its output.
func runDocBlock(b docBlock, dir string, env []string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", b.body)
	cmd.Dir, cmd.Env = dir, env
	switch b.mode {
	case "tty":
		ptmx, err := pty.Start(cmd)
		if err != nil {
			return nil, err
		}
		defer ptmx.Close()
		var out syncBuffer
		done := make(chan struct{})
		go func() { io.Copy(&out, ptmx); close(done) }()
		if _, err := ptmx.Write([]byte("exit\n")); err != nil {
			return out.Bytes(), err
		}
		err = cmd.Wait()
		ptmx.Close()
		<-done
		return out.Bytes(), err
	case "interrupt":
		var out syncBuffer
		cmd.Stdout, cmd.Stderr = &out, &out
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		// Serving: its last command has printed a line and runs on.
		deadline := time.After(time.Minute)
		for bytes.Count(out.Bytes(), []byte("\n")) == 0 || !docSettled(&out) {
			select {
			case err := <-exited:
				return out.Bytes(), fmt.Errorf("ended before Ctrl-C (%v): it should run until interrupted", err)
			case <-deadline:
				syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
				return out.Bytes(), fmt.Errorf("printed nothing in a minute")
			case <-time.After(100 * time.Millisecond):
			}
		}
		syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)
		select {
		case err := <-exited:
			var ee *exec.ExitError
			if err != nil && !(errors.As(err, &ee) && (ee.ExitCode() == 130 || ee.ExitCode() == 0 || !ee.Exited())) {
				return out.Bytes(), fmt.Errorf("on Ctrl-C: %w", err)
			}
			return out.Bytes(), nil
		case <-time.After(10 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			return out.Bytes(), fmt.Errorf("still running 10s after Ctrl-C")
		}
	default:
		return cmd.CombinedOutput()
	}
}

// docSettled reports whether an interrupt block's output has stopped
// growing for a second: its last command is then serving, not starting.
func docSettled(out *syncBuffer) bool {
	n := out.Len()
	time.Sleep(time.Second)
	return out.Len() == n
}

// syncBuffer is a bytes.Buffer that a copying goroutine and the test share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) Bytes() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]byte(nil), s.b.Bytes()...)
}

func (s *syncBuffer) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Len()
}

// tokenIDs are the ids of every key on the server.
func tokenIDs(t *testing.T, e *env) map[string]bool {
	t.Helper()
	toks, err := e.c.Tokens(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, x := range toks {
		ids[x.ID] = true
	}
	return ids
}
