package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/termsafe"
	"golang.org/x/term"
)

func newExecCmd(a *app) *cobra.Command {
	var env []string
	var workdir, user string
	var timeout time.Duration
	var interactive, tty bool
	cmd := &cobra.Command{
		Use:   "exec [flags] SANDBOX COMMAND [ARG...]",
		Short: "Run a command in a sandbox; its exit code is shard's",
		Long: `Run a command in a running sandbox, with stdout and stderr streamed live and
kept apart. Standard input is forwarded when it is a pipe or a file, or with -i.
-it gives an interactive terminal. The command's exit code is shard's exit code
(124 when --timeout ended it). Flags go before SANDBOX; everything after the
COMMAND is its own. A "--" after SANDBOX is dropped, as kubectl has it.

Without -t, Ctrl-C (SIGINT) and SIGTERM are passed on to the command (to its
process group) and shard waits for its end: a command that SIGINT ends
exits 130. A second Ctrl-C or SIGTERM stops waiting: shard exits 130 and
the command runs on in the sandbox. With -t, Ctrl-C is a key the command's
terminal gets.`,
		Example: `  shard exec base pip install --quiet requests
  shard exec base -- ls -la /tmp
  echo hello | shard exec base cat
  shard exec -it base bash`,
		Args: minArgs(2, "a SANDBOX and a COMMAND"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if args[1] == "--" {
				// kubectl's habit: "--" between the sandbox and the command.
				if args = append(args[:1], args[2:]...); len(args) < 2 {
					return fmt.Errorf("exec needs a COMMAND after \"--\"")
				}
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			req := client.ExecRequest{Argv: args[1:], Workdir: workdir, User: user, TTY: tty}
			if len(env) > 0 {
				for i, kv := range env {
					if !strings.Contains(kv, "=") {
						v, ok := os.LookupEnv(kv)
						if !ok {
							return fmt.Errorf("--env %s: not KEY=VALUE and not set here", kv)
						}
						env[i] = kv + "=" + v
					}
				}
				req.Env, _ = json.Marshal(env)
			}
			if err := timeoutFlag(timeout); err != nil {
				return err
			}
			if timeout > 0 {
				req.Timeout, _ = json.Marshal(timeout.String())
			}
			ctx := cmd.Context()
			stdinFwd := interactive || tty || stdinIsData()
			var res *client.ExecResult
			switch {
			case !tty:
				// The binary stream both ways: stdin as the command reads
				// it, and Ctrl-C and SIGTERM for the command.
				var stdin io.Reader
				if stdinFwd {
					stdin = os.Stdin
				}
				res, err = execForwardingSignals(ctx, c, args[0], req, stdin)
			default:
				if tty {
					if !term.IsTerminal(int(os.Stdin.Fd())) {
						return fmt.Errorf("-t needs a terminal on stdin (drop -t to pipe input)")
					}
					if w, h, err := term.GetSize(int(os.Stdout.Fd())); err == nil {
						req.Cols, req.Rows = uint16(w), uint16(h)
					}
				}
				sess, err := c.ExecInteractive(ctx, args[0], req)
				if err != nil {
					return err
				}
				if tty {
					old, err := term.MakeRaw(int(os.Stdin.Fd()))
					if err == nil {
						defer term.Restore(int(os.Stdin.Fd()), old)
					}
					winch := make(chan os.Signal, 1)
					signal.Notify(winch, syscall.SIGWINCH)
					defer signal.Stop(winch)
					go func() {
						for range winch {
							if w, h, err := term.GetSize(int(os.Stdout.Fd())); err == nil {
								sess.Resize(ctx, uint16(h), uint16(w))
							}
						}
					}()
				}
				res, err = sess.Run(ctx, os.Stdin, os.Stdout, os.Stderr)
				if err != nil {
					return err
				}
			}
			if err != nil {
				return err
			}
			if res.Error != "" {
				termsafe.Fprintln(os.Stderr, "shard: "+res.Error)
			}
			if res.TimedOut {
				if res.Error == "" {
					termsafe.Fprintf(os.Stderr, "shard: the command ran past --timeout %s and was killed\n", timeout)
				}
				return &exitError{code: 124}
			}
			if res.OOM {
				termsafe.Fprintln(os.Stderr, "shard: the command was killed: the sandbox ran out of memory")
			}
			if res.ExitCode != 0 {
				return &exitError{code: res.ExitCode}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.SetInterspersed(false) // flags after COMMAND belong to it
	f.StringArrayVarP(&env, "env", "e", nil, "environment variable KEY=VALUE for this command (repeatable)")
	f.StringVarP(&workdir, "workdir", "w", "", "working directory inside the sandbox")
	f.StringVarP(&user, "user", "u", "", "user to run as: name, uid, name:group or uid:gid")
	f.DurationVar(&timeout, "timeout", 0, "kill the command after this long (e.g. 30s); exit code 124")
	f.BoolVarP(&interactive, "interactive", "i", false, "forward standard input")
	f.BoolVarP(&tty, "tty", "t", false, "give the command a terminal")
	return cmd
}

// stdinIsData reports whether stdin is a pipe or a file (not a terminal,
// not /dev/null): then it is forwarded without -i.
func stdinIsData() bool {
	st, err := os.Stdin.Stat()
	if err != nil {
		return false
	}
	m := st.Mode()
	return m&os.ModeNamedPipe != 0 || m.IsRegular() || m&os.ModeSocket != 0
}

// execForwardingSignals runs a command (stdin nil: none) with SIGINT and
// SIGTERM passed on to it, as docker run's signal proxy does: the first
// goes to the command, whose end is then shard's; a second stops waiting
// (exit 130), leaving the command to run on in the sandbox.
func execForwardingSignals(ctx context.Context, c *client.Client, sandbox string, req client.ExecRequest, stdin io.Reader) (*client.ExecResult, error) {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	// main's context ends at the first signal; the stream must outlive it.
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	fwd := make(chan int, 1)
	var detached atomic.Bool
	go func() {
		forwarded := false
		for {
			select {
			case s := <-sigs:
				if !forwarded {
					forwarded = true
					fwd <- int(s.(syscall.Signal))
					continue
				}
				detached.Store(true)
				cancel()
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	res, err := c.ExecPipeSignals(ctx, sandbox, req, stdin, fwd, os.Stdout, os.Stderr)
	if detached.Load() {
		termsafe.Fprintln(os.Stderr, "shard: stopped waiting; the command runs on in the sandbox")
		return nil, &exitError{code: 130}
	}
	return res, err
}
