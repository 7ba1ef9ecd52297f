package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/spf13/cobra"
	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/names"
	"github.com/useshards/shard/internal/termsafe"
)

func newPortCmd(a *app) *cobra.Command {
	var listen string
	var printURL bool
	cmd := &cobra.Command{
		Use:   "port SANDBOX PORT [--listen ADDR]",
		Short: "Reach a server in a sandbox from here: a local address that forwards to its port",
		Long: `Serve a local address (--listen, default 127.0.0.1 on a free port) that
forwards every request, of any method, and WebSocket upgrades, to PORT inside
SANDBOX, through the shard server (over its Unix socket, or SHARD_REMOTE with
SHARD_API_KEY): nothing in the sandbox is published on the network. shard
port prints the local URL, e.g. http://127.0.0.1:43121/, and runs until
Ctrl-C. A request for /a/b there reaches the sandbox's server as /a/b.

The server's end of it is /v0/sandboxes/{id}/ports/{port}/{path}, which
needs a key with sandbox:write (sent by shard port; the server in the sandbox
never sees it). --print-url prints that URL and exits.

The sandbox must be running and something in it must listen on PORT (on
0.0.0.0 or its address, not only 127.0.0.1): else the answer is 409
sandbox_not_running or 502 port_unreachable.

Anyone who can reach the local address uses the port with your key: keep
--listen on 127.0.0.1 unless you mean to share it.`,
		Example: `  shard exec base sh -c 'python3 -m http.server 8000 >/dev/null 2>&1 &'
  shard port base 8000                   # prints http://127.0.0.1:43121/; Ctrl-C ends it
  shard port --listen 127.0.0.1:8080 base 8000
  shard port --print-url base 8000`,
		Args: exactArgs(2, "a SANDBOX and a PORT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			port, err := parsePort(args[1])
			if err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			if printURL {
				termsafe.Println(c.PortURL(args[0], port, ""))
				if sock, ok := a.onSocket(); ok {
					termsafe.Fprintf(os.Stderr, "(over the Unix socket: curl --unix-socket %s URL)\n", sock)
				}
				return nil
			}
			ctx := cmd.Context()
			id, name := args[0], args[0]
			sb, err := c.Get(ctx, args[0])
			var ce *client.Error
			switch {
			case err == nil:
				if sb.State != "running" {
					return fmt.Errorf("sandbox %s is %s: ports are reached in a running sandbox (shard start %s)", sb.Name, sb.State, sb.Name)
				}
				id, name = sb.ID, sb.Name
			case errors.As(err, &ce) && ce.Code == client.CodeMissingScope:
				// A key with sandbox:write but not sandbox:read: the
				// requests themselves will say what is wrong, if anything.
			default:
				return err
			}
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("--listen %s: %w", listen, err)
			}
			srv := &http.Server{Handler: c.PortProxy(id, port), ReadHeaderTimeout: time.Minute}
			termsafe.Println(localURL(ln.Addr()))
			if ta, ok := ln.Addr().(*net.TCPAddr); ok && !ta.IP.IsLoopback() {
				termsafe.Fprintf(os.Stderr, "shard: listening on %s: anyone who can reach it uses port %d of %s with your key\n", ta, port, name)
			}
			termsafe.Fprintf(os.Stderr, "forwarding to port %d of sandbox %s; Ctrl-C to stop\n", port, name)
			return serveUntil(ctx, srv, ln)
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:0", "local address to serve on (port 0: a free one)")
	cmd.Flags().BoolVar(&printURL, "print-url", false, "print the server's URL for the port and exit")
	return cmd
}

// parsePort reads a TCP port, 1 to 65535.
func parsePort(s string) (int, error) {
	return names.Port(s)
}

// localURL is the URL to give people for a listener: an unspecified
// address (0.0.0.0, ::) becomes the loopback one.
func localURL(addr net.Addr) string {
	ta, ok := addr.(*net.TCPAddr)
	if !ok {
		return "http://" + addr.String() + "/"
	}
	ip := ta.IP
	if ip.IsUnspecified() {
		ip = net.IPv4(127, 0, 0, 1)
		if ta.IP.To4() == nil {
			ip = net.IPv6loopback
		}
	}
	return "http://" + net.JoinHostPort(ip.String(), strconv.Itoa(ta.Port)) + "/"
}

// serveUntil serves ln until ctx ends (Ctrl-C), then shuts srv down, giving
// requests under way two seconds: the local servers of shard port and
// shard ui.
func serveUntil(ctx context.Context, srv *http.Server, ln net.Listener) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if srv.Shutdown(sctx) != nil {
		srv.Close()
	}
	return nil
}
