// Command shard is the sandbox server (`shard serve`) and its command line.

// Go's DNS resolver, never the C library's, also in a build with cgo
// (static.go): the static C library's would load shared modules at run time.
//
//go:debug netdns=go
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/termsafe"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// exitError carries an exit code out of a command (exec's command exit code).
type exitError struct{ code int }

func (e *exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// app holds what every verb shares: the flags that say how to reach the server.
type app struct {
	socket    string
	project   string
	json      bool
	warnedKey bool // the SHARD_API_KEY-without-SHARD_REMOTE warning was given
}

func (a *app) client() (*client.Client, error) {
	if _, sock := a.onSocket(); sock && os.Getenv("SHARD_API_KEY") != "" && !a.warnedKey {
		// A key exported for a remote server, and a shell without its
		// URL: the socket answers as administrator and the key is unused.
		a.warnedKey = true
		termsafe.Fprintln(os.Stderr, "shard: SHARD_API_KEY is set but SHARD_REMOTE is not: the key is not used, and this goes to the Unix socket (as its administrator); set SHARD_REMOTE to the server's --listen URL to use the key")
	}
	return client.New(client.Options{Socket: a.socket, Project: a.project})
}

// onSocket reports whether a.client reaches the server over its Unix
// socket (as client.New decides), and which one.
func (a *app) onSocket() (string, bool) {
	if a.socket != "" {
		return a.socket, true
	}
	if os.Getenv("SHARD_REMOTE") != "" {
		return "", false
	}
	return client.DefaultSocket, true
}

func newRoot() *cobra.Command {
	a := &app{}
	root := &cobra.Command{
		Use:   "shard",
		Short: "Sandboxes for untrusted code: create, exec, fork",
		Long: `shard runs untrusted code in sandboxes (gVisor or runc) from OCI images,
and forks running ones: files, memory and processes. It keeps snapshots
(files), checkpoints (memory, processes and files) and named environments to
start sandboxes from, and a ledger of what happened in each, from which
'shard resume' recreates one.

'shard serve' is the server; every other verb talks to it: over its Unix
socket (--socket, default /run/shard/shard.sock; whoever can open it is the
administrator), or over HTTP to the URL in SHARD_REMOTE with an API key
('shard token create') in SHARD_API_KEY. Secrets reach sandboxes through
grants ('shard secret', 'shard grant'); 'shard policy' limits where a
sandbox may connect to; 'shard port' reaches a server inside one.

Everything lives in a project (--project, default "default"): a key made for
one project ('shard token create --project NAME') sees and touches only that
project's sandboxes, checkpoints, snapshots, environments, ledger, secrets
and imported images.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version,
	}
	root.PersistentFlags().StringVar(&a.socket, "socket", "", "server's Unix socket (default "+client.DefaultSocket+", or SHARD_REMOTE)")
	root.PersistentFlags().StringVar(&a.project, "project", "", "project to act in (default SHARD_PROJECT, else the key's own, else default)")
	root.AddCommand(
		newServeCmd(), newAgentCmd(), newCopyMemoryCmd(), newFilesHelperCmd(),
		newCreateCmd(a), newListCmd(a), newInspectCmd(a), newExecCmd(a),
		newStopCmd(a), newStartCmd(a), newRemoveCmd(a), newForkCmd(a),
		newSnapshotCmd(a), newCheckpointCmd(a), newRestoreCmd(a), newResumeCmd(a),
		newLedgerCmd(a), newEnvCmd(a), newDfCmd(a),
		newImageCmd(a), newCapabilitiesCmd(a),
		newTokenCmd(a), newSecretCmd(a), newGrantCmd(a), newUngrantCmd(a),
		newPolicyCmd(a), newPortCmd(a), newProjectCmd(a),
		newCpCmd(a), newCatCmd(a), newWriteCmd(a), newLsCmd(a), newTreeCmd(a), newDiffCmd(a), newWhoamiCmd(a), newVersionCmd(a), newUICmd(a), newNodeCmd(a),
	)
	refuseUnknownSubcommands(root)
	return root
}

// refuseUnknownSubcommands makes every command group under root that does
// nothing itself (shard snapshot, shard env, ...) refuse an argument that
// is none of its subcommands, as cobra does only for the root: left alone,
// `shard snapshot bogus` printed the group's help and exited 0. Called with
// no arguments, a group still prints its help.
func refuseUnknownSubcommands(root *cobra.Command) {
	for _, c := range root.Commands() {
		refuseUnknownSubcommands(c)
		if !c.HasSubCommands() || c.Runnable() {
			continue
		}
		c.Args = cobra.ArbitraryArgs
		c.RunE = func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return cmd.Help()
			}
			return unknownCommand(cmd, args[0])
		}
	}
}

// unknownCommand is cobra's own error for a mistyped verb of the root, for
// any command: `unknown command "bogus" for "shard snapshot"`, and the
// subcommands it may have meant.
func unknownCommand(cmd *cobra.Command, arg string) error {
	msg := fmt.Sprintf("unknown command %q for %q", arg, cmd.CommandPath())
	if cmd.SuggestionsMinimumDistance <= 0 {
		cmd.SuggestionsMinimumDistance = 2 // cobra's default, set only on the root's path
	}
	if s := cmd.SuggestionsFor(arg); len(s) > 0 {
		msg += "\n\nDid you mean this?\n"
		for _, v := range s {
			msg += "\t" + v + "\n"
		}
	}
	return errors.New(msg)
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRoot().ExecuteContext(ctx)
	stop()
	if err != nil {
		var ee *exitError
		if errors.As(err, &ee) {
			os.Exit(ee.code)
		}
		printError(os.Stderr, err)
		var ce *client.Error
		if errors.As(err, &ce) && ce.Code == client.CodeCommandNotFound {
			os.Exit(127)
		}
		os.Exit(1)
	}
}

// printError prints a command's error for people. An error that carries
// the server's text (a client.Error) is escaped whole; the CLI's own (and
// cobra's) keep their line breaks and indenting tabs, every line escaped.
func printError(w io.Writer, err error) {
	var ce *client.Error
	if !errors.As(err, &ce) {
		io.WriteString(w, "shard: "+termsafe.EscapeLines(strings.TrimSuffix(err.Error(), "\n"))+"\n")
		return
	}
	termsafe.Fprintln(w, "shard:", err)
	if ce.Status >= 500 && ce.RequestID != "" {
		// A fault of the server: its log has the rest, under this id.
		termsafe.Fprintf(w, "shard: (request id %s in the server's log)\n", ce.RequestID)
	}
}
