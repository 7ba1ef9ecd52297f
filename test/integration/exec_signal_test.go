package integration

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/useshards/shard/client"
)

// TestExecCLISignal: Ctrl-C on a plain (no -t) `shard exec` goes to the
// command, as docker run's signal proxy has it: the command dies of it, and
// shard exits with its status, 130. A command that ignores SIGINT keeps
// shard waiting until a second Ctrl-C, which leaves it running.
func TestExecCLISignal(t *testing.T) {
	e := need(t)
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			sb := create(t, client.CreateRequest{Image: busybox, Provider: prov})
			// running reports whether a process with args is in the sandbox.
			running := func(args string) bool {
				return strings.Contains(execOK(t, sb.ID, "ps", "-o", "args"), args)
			}
			// start runs shard exec with argv as a background process, its
			// stdin /dev/null (no terminal, nothing forwarded), once args
			// show in the sandbox.
			start := func(args string, argv ...string) (*exec.Cmd, *bytes.Buffer, <-chan error) {
				cmd := exec.Command(e.bin, append([]string{"--socket", e.socket, "exec", sb.ID, "--"}, argv...)...)
				var stderr bytes.Buffer
				cmd.Stderr = &stderr
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				done, exited := make(chan error, 1), make(chan struct{})
				go func() { done <- cmd.Wait(); close(exited) }()
				t.Cleanup(func() { cmd.Process.Kill(); <-exited })
				waitFor(t, 30*time.Second, func() bool { return running(args) })
				return cmd, &stderr, done
			}
			exitCode := func(done <-chan error, stderr *bytes.Buffer) int {
				t.Helper()
				select {
				case err := <-done:
					var ee *exec.ExitError
					if err == nil {
						return 0
					}
					if !errors.As(err, &ee) {
						t.Fatal(err)
					}
					return ee.ExitCode()
				case <-time.After(30 * time.Second):
					t.Fatalf("shard exec still runs 30 s after SIGINT (stderr %q)", stderr)
					return -1
				}
			}

			cmd, stderr, done := start("sleep 3217", "sleep", "3217")
			cmd.Process.Signal(os.Interrupt)
			if code := exitCode(done, stderr); code != 130 {
				t.Errorf("shard exec sleep, SIGINT: exit %d, stderr %q; want 130 (the command's end by SIGINT)", code, stderr)
			}
			if running("sleep 3217") {
				t.Errorf("sleep 3217 still runs in the sandbox after SIGINT to shard exec; want it ended by the forwarded SIGINT")
			}

			// SIGINT ignored (sleep inherits the ignoring): the first goes
			// to the command, to no effect; the second lets it go.
			cmd, stderr, done = start("sleep 3218", "sh", "-c", "trap '' INT; sleep 3218")
			cmd.Process.Signal(os.Interrupt)
			select {
			case err := <-done:
				t.Fatalf("shard exec ended after one SIGINT to a command ignoring it: %v, stderr %q", err, stderr)
			case <-time.After(2 * time.Second):
			}
			cmd.Process.Signal(syscall.SIGINT)
			if code := exitCode(done, stderr); code != 130 || !strings.Contains(stderr.String(), "runs on") {
				t.Errorf("shard exec, a second SIGINT: exit %d, stderr %q; want 130 and that the command runs on", code, stderr)
			}
			if !running("sleep 3218") {
				t.Errorf("sleep 3218 is gone after shard exec stopped waiting; want it left running")
			}
		})
	}
}
