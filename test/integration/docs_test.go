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
	"slices"
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
// ```sh run-by=TestName, a Test or Benchmark of test/integration, or
// run-by=scripts/NAME or .ci/NAME, a script that runs a command of the
// block (run-by=.ci/run). `sh tty` runs a block on a terminal that types
// `exit` (shard exec -it), and `sh interrupt` one whose last command runs
// until Ctrl-C (shard port, shard ui, --follow): it must be still running
// once it has printed a line, and end on SIGINT. Anything else (`text`
// for output, `ts`, `python`, `go`) is not a command.
//
// A block run here reaches the test server only, and only the projects it
// names: it may not name a socket, start a server, change SHARD_REMOTE or
// SHARD_PROJECT, run sudo or env with options, or name the project default
// (docRefused); a block that needs to is run by a test of its own. Every
// block runs in a process group of its own, killed whole once it ends.

// docFence is the opening line of a fenced block: its language and the rest.
var docFence = regexp.MustCompile("^```([A-Za-z0-9_-]*)[ \t]*(.*)$")

// docProject finds the projects a block's commands name.
var docProject = regexp.MustCompile(`--project[ =]([A-Za-z0-9][A-Za-z0-9_.-]*)`)

// docProjectFlag finds every --project, whatever follows it.
var docProjectFlag = regexp.MustCompile(`--project\b([ =]?)(\S*)`)

// docRefused is what a block run here may not contain: each reaches a
// server other than the test's (the host's own, on its socket) or leaves
// the projects the test empties afterwards.
var docRefused = []struct {
	re  *regexp.Regexp
	why string
}{
	{regexp.MustCompile(`--socket\b|--unix-socket\b|\.sock\b`), "names a Unix socket (the host's own server)"},
	{regexp.MustCompile(`\bSHARD_(REMOTE|PROJECT)=`), "sets SHARD_REMOTE or SHARD_PROJECT"},
	{regexp.MustCompile(`\bunset\b[^\n;&|]*\bSHARD_(REMOTE|PROJECT)\b`), "unsets SHARD_REMOTE or SHARD_PROJECT"},
	{regexp.MustCompile(`\benv\s+-`), "runs env with options (env -u, env -i: a command without the test's server)"},
	{regexp.MustCompile(`\bshard\s+serve\b`), "starts shard serve"},
	{regexp.MustCompile(`\bsudo\b`), "runs sudo"},
}

// docRunBy are the scripts a block may say run it.
var docRunBy = regexp.MustCompile(`^(scripts|\.ci)(/[A-Za-z0-9_.-]+)+$`)

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

// checkDocBlock says what is wrong with a block: a run-by that names no
// test of test/integration (names) nor a script under scripts/ or .ci/ of
// root that mentions one of the block's commands; or, in a block run here,
// what docRefused refuses, and a project the test cannot empty afterwards.
func checkDocBlock(root string, names map[string]bool, b docBlock) error {
	if b.runBy != "" {
		if names[b.runBy] {
			return nil
		}
		if !docRunBy.MatchString(b.runBy) || slices.Contains(strings.Split(b.runBy, "/"), "..") {
			return fmt.Errorf("run-by=%s: name a Test or Benchmark of test/integration, or a script under scripts/ or .ci/", b.runBy)
		}
		if st, err := os.Lstat(filepath.Join(root, b.runBy)); err != nil || !st.Mode().IsRegular() {
			return fmt.Errorf("run-by=%s: no such test in test/integration, nor script in the repository", b.runBy)
		}
		text, err := os.ReadFile(filepath.Join(root, b.runBy))
		if err != nil {
			return err
		}
		cmds := blockCommands(b.body)
		for _, c := range cmds {
			if strings.Contains(string(text), c) {
				return nil
			}
		}
		return fmt.Errorf("run-by=%s: the script runs none of the block's commands (%s)", b.runBy, strings.Join(cmds, ", "))
	}
	for _, r := range docRefused {
		if m := r.re.FindString(b.body); m != "" {
			return fmt.Errorf("the block %s (%q): it would reach past the test's server and projects; have a test run it (sh run-by=TestName)", r.why, m)
		}
	}
	for _, m := range docProjectFlag.FindAllStringSubmatch(b.body, -1) {
		switch {
		case m[1] == "" || !docProject.MatchString(m[0]):
			return fmt.Errorf("%q: name the project literally (--project NAME), so the test can empty it afterwards", m[0])
		case m[2] == "default":
			return fmt.Errorf("%q: a block run here acts in projects of its own, never default (the test empties them afterwards)", m[0])
		}
	}
	return nil
}

// docComment is a shell comment; docSeparator what ends a command.
var (
	docComment   = regexp.MustCompile(`(^|\s)#.*`)
	docSeparator = regexp.MustCompile(`&&|\|\||[;|&]`)
)

// blockCommands are the commands a block runs, as a script would mention
// them: the first word of each command, past variable assignments, with
// the verb for go and shard ("go test", "shard create").
func blockCommands(body string) []string {
	var out []string
	for _, line := range strings.Split(body, "\n") {
		line = docComment.ReplaceAllString(line, "")
		for _, part := range docSeparator.Split(line, -1) {
			f := strings.Fields(part)
			for len(f) > 0 && strings.Contains(f[0], "=") {
				f = f[1:]
			}
			if len(f) == 0 {
				continue
			}
			c := f[0]
			if (c == "go" || c == "shard") && len(f) > 1 {
				c += " " + f[1]
			}
			if !slices.Contains(out, c) {
				out = append(out, c)
			}
		}
	}
	return out
}

// TestDocsShape checks what needs no server: every sh block is run here,
// within the test's server and projects, or names a test or script that
// runs it (checkDocBlock), and the README stays a page (two screens).
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
			} else {
				delegated++
			}
			if err := checkDocBlock(root, names, b); err != nil {
				t.Errorf("%s:%d: %v", rel(root, b.file), b.line, err)
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
	names := testNames(t, filepath.Join(root, "test", "integration"))
	for _, f := range files {
		blocks, err := docBlocks(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range blocks {
			if err := checkDocBlock(root, names, b); err != nil {
				t.Fatalf("%s:%d: %v (TestDocsShape)", rel(root, b.file), b.line, err)
			}
		}
		name := strings.TrimSuffix(filepath.Base(f), ".md")
		t.Run(name, func(t *testing.T) {
			// The document's own project, emptied before and after; and
			// those its commands name, emptied after if they held nothing
			// before (what another test, or someone, keeps there stays).
			project := "docs-" + strings.ToLower(name)
			emptyProject(t, e, project)
			t.Cleanup(func() { emptyProject(t, e, project) })
			held := heldProjects(t, e)
			for _, b := range blocks {
				for _, m := range docProject.FindAllStringSubmatch(b.body, -1) {
					p := m[1]
					switch {
					case p == project || p == "default":
					case held[p]:
						t.Logf("project %s held things before %s ran: left as it is afterwards", p, rel(root, f))
					default:
						held[p] = true // once
						t.Cleanup(func() { emptyProject(t, e, p) })
					}
				}
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
				ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
				out, err := runDocBlock(ctx, b, dir, env)
				cancel()
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

// heldProjects are the projects that hold anything on the test server.
func heldProjects(t *testing.T, e *env) map[string]bool {
	t.Helper()
	ps, err := e.c.Projects(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	held := map[string]bool{}
	for _, p := range ps {
		held[p.Name] = true
	}
	return held
}

// runDocBlock runs one block as its mode says, until ctx ends, and returns
// its output. It runs in a process group of its own (on a terminal, the
// session pty.Start makes), killed whole when ctx ends and once bash has
// ended: what the block sent to the background neither outlives it nor
// holds its output open.
func runDocBlock(ctx context.Context, b docBlock, dir string, env []string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", b.body)
	cmd.Dir, cmd.Env = dir, env
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var src *os.File // where its output comes from
	if b.mode == "tty" {
		ptmx, err := pty.Start(cmd)
		if err != nil {
			return nil, err
		}
		src = ptmx
	} else {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		cmd.Stdout, cmd.Stderr = w, w // a file: Wait does not wait for its readers
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		err = cmd.Start()
		w.Close()
		if err != nil {
			r.Close()
			return nil, err
		}
		src = r
	}
	var out syncBuffer
	copied := make(chan struct{})
	go func() { io.Copy(&out, src); close(copied) }()
	// output kills what is left of the block and returns all it wrote.
	output := func() []byte {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		select {
		case <-copied:
		case <-time.After(5 * time.Second): // held by a process that left the group
		}
		src.Close()
		return out.Bytes()
	}
	timedOut := func(err error) error {
		if ctx.Err() != nil {
			return fmt.Errorf("still running at the timeout (%w): %v", ctx.Err(), err)
		}
		return err
	}
	switch b.mode {
	case "tty":
		if _, err := src.Write([]byte("exit\n")); err != nil {
			return output(), err
		}
		err := cmd.Wait()
		return output(), timedOut(err)
	case "interrupt":
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		// Serving: its last command has printed a line and runs on.
		deadline := time.After(time.Minute)
		for bytes.Count(out.Bytes(), []byte("\n")) == 0 || !docSettled(&out) {
			select {
			case err := <-exited:
				return output(), fmt.Errorf("ended before Ctrl-C (%v): it should run until interrupted", timedOut(err))
			case <-deadline:
				return output(), fmt.Errorf("printed nothing in a minute")
			case <-time.After(100 * time.Millisecond):
			}
		}
		syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)
		select {
		case err := <-exited:
			var ee *exec.ExitError
			if err != nil && !(errors.As(err, &ee) && (ee.ExitCode() == 130 || ee.ExitCode() == 0 || !ee.Exited())) {
				return output(), fmt.Errorf("on Ctrl-C: %w", err)
			}
			return output(), nil
		case <-time.After(10 * time.Second):
			return output(), fmt.Errorf("still running 10s after Ctrl-C")
		}
	default:
		err := cmd.Wait()
		return output(), timedOut(err)
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
