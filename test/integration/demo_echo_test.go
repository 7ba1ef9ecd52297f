package integration

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestDemoEchoesQuoted: the commands the demo scripts show read back,
// pasted into a shell, as the argv they ran; "$*" had dropped their quoting
// (`$ shard exec base sh -c mkdir -p ... && echo '...'`). It needs no
// server: scripts/say.sh, which both demos source for say, shq and run, is
// run alone in bash.
func TestDemoEchoesQuoted(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	defs, err := os.ReadFile(filepath.Join(root, "scripts", "say.sh"))
	if err != nil {
		t.Fatal(err)
	}
	for _, demo := range []string{"demo.sh", "demo-cluster.sh"} {
		script, err := os.ReadFile(filepath.Join(root, "scripts", demo))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(script, []byte(`. "$ROOT/scripts/say.sh"`)) || regexp.MustCompile(`(?m)^(say|run)\(\)`).Match(script) {
			t.Errorf("scripts/%s does not take say and run from scripts/say.sh", demo)
		}
	}
	argv := []string{"true", "exec", "base", "sh", "-c",
		`mkdir -p /tmp/site && echo '__version__ = "2.31.0"' > /dev/null`,
		"it's", "", "$HOME", `a\b`, "x y", "--memory", "512MiB"}
	out, err := exec.Command("bash", append([]string{"-c", string(defs) + `run "$@"`, "demo"}, argv...)...).Output()
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	m := regexp.MustCompile(`\$ (.*)\x1b\[0m`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("run printed %q, want a $ line", out)
	}
	// Pasted into a shell: the words it reads are the argv run ran. The
	// shell is restricted (no redirection) and finds no program, so a
	// line that lost its quoting runs nothing here.
	paste := exec.Command("bash", "-r", "-c", `eval "set -- $1"; printf '%s\0' "$@"`, "paste", string(m[1]))
	paste.Env = []string{"PATH=/nonexistent"}
	back, err := paste.Output()
	if err != nil {
		t.Fatalf("the shown command %q does not read back: %v", m[1], err)
	}
	if got := strings.Split(strings.TrimSuffix(string(back), "\x00"), "\x00"); !slices.Equal(got, argv) {
		t.Errorf("run showed %s, which a shell reads as %q; want %q", m[1], got, argv)
	}
}
