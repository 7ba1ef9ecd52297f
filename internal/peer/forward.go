package peer

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"

	"github.com/useshards/shard/client"
)

// Forward sends r on to the node as it is and streams the node's answer
// back, whatever it is (exec streams, WebSocket upgrades, ledger follows, a
// sandbox's own server behind the ports proxy); body, when not nil, is r's
// body read already. r's context carries its Caller (WithCaller). When the
// node gives no answer, fail answers the error (errorOf's).
func (n *Node) Forward(w http.ResponseWriter, r *http.Request, body []byte, fail func(http.ResponseWriter, *http.Request, error)) {
	if body == nil && r.ContentLength != 0 && r.Body != nil && r.Body != http.NoBody {
		// A body may go on while the answer streams (a framed exec's stdin
		// and signals, as the CLI sends every exec): HTTP/1 would stop
		// reading it once the answer began, cutting the node's stream
		// ("exec stream: unexpected EOF"). As the node's own answer to
		// such a body, the connection then serves no other request.
		rc := http.NewResponseController(w)
		if rc.EnableFullDuplex() == nil {
			w.Header().Set("Connection", "close")
		}
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(n.target)
			if body != nil {
				pr.Out.Body = io.NopCloser(bytes.NewReader(body))
				pr.Out.ContentLength = int64(len(body))
			}
		},
		Transport:     n.signed,
		FlushInterval: -1, // streams: every write goes out at once
		ModifyResponse: func(resp *http.Response) error {
			resp.Header.Del(client.RequestIDHeader) // the caller's answer has it already (the same id)
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			// The proxy's errors are its transport's: no answer came.
			fail(w, r, n.errorOf(r.Context(), &url.Error{Op: r.Method, URL: r.URL.String(), Err: err}))
		},
	}
	rp.ServeHTTP(w, r)
}
