package main

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/termsafe"
)

func newUICmd(a *app) *cobra.Command {
	var listen string
	cmd := &cobra.Command{
		Use:   "ui [--listen ADDR]",
		Short: "Serve the web console on a local address (for a server reached over its Unix socket)",
		Long: `Serve shard's web console on a local address (--listen, default 127.0.0.1
on a free port), forwarding what it asks to the server over its Unix socket
(or SHARD_REMOTE with SHARD_API_KEY), and print its URL. Nothing is opened by
itself: open the URL in a browser. It runs until Ctrl-C.

The URL carries a key made for this run only (after #key=, which a browser
never sends over the network): the console sends it with each request, and
requests without it are refused. So another user of this machine who
reaches the port cannot act with your rights, yet whoever has the URL can:
do not share it, and keep --listen on 127.0.0.1.

A server started with --listen serves the console itself at /ui/ (it asks
for an API key there); shard ui is for one reached over its socket.`,
		Example: `  shard ui                          # prints http://127.0.0.1:43121/ui/#key=...; Ctrl-C ends it
  shard ui --listen 127.0.0.1:8080`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			if _, err := c.Whoami(ctx); err != nil { // the server answers, and takes the key
				return err
			}
			b := make([]byte, 24)
			rand.Read(b)
			session := "shui_" + hex.EncodeToString(b)
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("--listen %s: %w", listen, err)
			}
			srv := &http.Server{Handler: uiGate(session, c.ServerProxy()), ReadHeaderTimeout: time.Minute}
			termsafe.Println(strings.TrimSuffix(localURL(ln.Addr()), "/") + "/ui/#key=" + session)
			if ta, ok := ln.Addr().(*net.TCPAddr); ok && !ta.IP.IsLoopback() {
				termsafe.Fprintf(os.Stderr, "shard: listening on %s: anyone who reaches it and has the URL acts with your rights\n", ta)
			}
			termsafe.Fprintln(os.Stderr, "serving the console; Ctrl-C to stop")
			return serveUntil(ctx, srv, ln)
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:0", "local address to serve on (port 0: a free one)")
	return cmd
}

// uiGate lets the console's own files through (/ui/: nothing secret), and
// the API (/v0/) only to a request carrying session as its key, in the
// Authorization header or, for a WebSocket upgrade (which a browser cannot
// give headers), a subprotocol (client.KeyProtocol) or ?access_token=.
// Nothing else is forwarded.
func uiGate(session string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Only clean paths: /ui/../v0/... starts with /ui/ but is not the
		// console's (the server would redirect it; the gate does not rely
		// on that). The console never asks for one.
		if p := r.URL.Path; p != cleanPath(p) {
			uiRefuse(w, http.StatusNotFound, client.CodeNotFound, "shard ui forwards clean paths only")
			return
		}
		switch {
		case r.URL.Path == "/" || r.URL.Path == "/ui":
			http.Redirect(w, r, "/ui/", http.StatusFound)
			return
		case strings.HasPrefix(r.URL.Path, "/ui/"):
			next.ServeHTTP(w, r)
			return
		case strings.HasPrefix(r.URL.Path, "/v0/"):
		default:
			uiRefuse(w, http.StatusNotFound, client.CodeNotFound, "shard ui forwards the console (/ui/) and the API (/v0/) only")
			return
		}
		key, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok && strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			if key, ok = client.KeyFromProtocols(r.Header); !ok {
				key, ok = r.URL.Query().Get("access_token"), true
			}
		}
		if !ok || subtle.ConstantTimeCompare([]byte(strings.TrimSpace(key)), []byte(session)) != 1 {
			uiRefuse(w, http.StatusUnauthorized, client.CodeUnauthenticated, "shard ui needs the key of its URL (after #key=): open the URL it printed")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// cleanPath is p without dot segments or doubled slashes, keeping a
// trailing slash.
func cleanPath(p string) string {
	c := path.Clean("/" + p)
	if strings.HasSuffix(p, "/") && c != "/" {
		c += "/"
	}
	return c
}

func uiRefuse(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]string{"code": code, "message": msg})
}
