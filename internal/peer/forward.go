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
