package integration

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"html"
	"net"
	"net/http"
	"sort"
	"strings"
	"testing"

	"github.com/useshards/shard/client"
)

// A small PEP 503 package index, for the seeds' pip steps on a machine that
// cannot reach PyPI: it serves pure-Python wheels made here, each a module
// whose __version__ is its version, from a network namespace of the test's
// own that sandboxes reach through their NAT.

// fakePackages are the names and versions the seeds install.
var fakePackages = map[string][]string{
	"requests": {"2.31.0", "2.32.3"},
	"numpy":    {"1.26.4"},
	"pandas":   {"2.2.2"},
	"torch":    {"2.3.0"},
}

// wheel builds NAME-VERSION-py3-none-any.whl.
func wheel(name, version string) []byte {
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	dist := name + "-" + version + ".dist-info"
	files := []struct{ path, body string }{
		{name + "/__init__.py", fmt.Sprintf("__version__ = %q\n", version)},
		{dist + "/METADATA", fmt.Sprintf("Metadata-Version: 2.1\nName: %s\nVersion: %s\nSummary: a stand-in made by shard's tests\n", name, version)},
		{dist + "/WHEEL", "Wheel-Version: 1.0\nGenerator: shard-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var record strings.Builder
	for _, f := range files {
		w, _ := zw.Create(f.path)
		w.Write([]byte(f.body))
		sum := sha256.Sum256([]byte(f.body))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", f.path, base64.RawURLEncoding.EncodeToString(sum[:]), len(f.body))
	}
	record.WriteString(dist + "/RECORD,,\n")
	w, _ := zw.Create(dist + "/RECORD")
	w.Write([]byte(record.String()))
	zw.Close()
	return buf.Bytes()
}

// indexHandler serves /simple/, /simple/NAME/ and /packages/FILE.
func indexHandler() http.Handler {
	files := map[string][]byte{}
	links := map[string][]string{}
	for name, versions := range fakePackages {
		for _, v := range versions {
			fn := fmt.Sprintf("%s-%s-py3-none-any.whl", name, v)
			files[fn] = wheel(name, v)
			sum := sha256.Sum256(files[fn])
			links[name] = append(links[name], fmt.Sprintf(`<a href="/packages/%s#sha256=%s">%s</a>`, fn, hex.EncodeToString(sum[:]), html.EscapeString(fn)))
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /simple/", func(w http.ResponseWriter, r *http.Request) {
		var names []string
		for n := range links {
			names = append(names, n)
		}
		sort.Strings(names)
		fmt.Fprint(w, "<!DOCTYPE html><html><body>\n")
		for _, n := range names {
			fmt.Fprintf(w, "<a href=\"/simple/%s/\">%s</a>\n", n, n)
		}
		fmt.Fprint(w, "</body></html>\n")
	})
	mux.HandleFunc("GET /simple/{name}/", func(w http.ResponseWriter, r *http.Request) {
		l, ok := links[strings.ToLower(r.PathValue("name"))]
		if !ok {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, "<!DOCTYPE html><html><body>\n%s\n</body></html>\n", strings.Join(l, "\n"))
	})
	mux.HandleFunc("GET /packages/{file}", func(w http.ResponseWriter, r *http.Request) {
		b, ok := files[r.PathValue("file")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Write(b)
	})
	return mux
}

// Where the index lives: a namespace of its own, 198.18.252.2 (where the
// egress boundary lets sandboxes go: not a private range), behind a
// veth from the host (198.18.252.1).
const (
	pypiNS   = "shardit-pypi"
	pypiIP   = "198.18.252.2"
	pypiHost = "198.18.252.1"
)

// startPackageIndex serves the index in its namespace and returns its
// simple/ URL, reachable from inside sandboxes.
func startPackageIndex(t testing.TB) string {
	t.Helper()
	testHost(t, pypiNS, "vshpypi", pypiHost, pypiIP)
	var ln net.Listener
	if err := inNetns(pypiNS, func() (err error) {
		ln, err = net.Listen("tcp", pypiIP+":8080")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: indexHandler()}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + pypiIP + ":8080/simple/"
}

// TestPackageIndex: the seeds' pip steps against the index, from inside a
// sandbox: install, a pinned version, an upgrade.
func TestPackageIndex(t *testing.T) {
	index := startPackageIndex(t)
	sb := create(t, client.CreateRequest{Image: python, Env: jsonRaw2(map[string]string{"PIP_INDEX_URL": index})})
	check := []string{"python", "-c", "import requests; print(requests.__version__)"}
	execOK(t, sb.ID, "pip", "install", "--quiet", "requests==2.31.0")
	if got := execOK(t, sb.ID, check...); got != "2.31.0\n" {
		t.Fatalf("pinned: %q", got)
	}
	execOK(t, sb.ID, "pip", "install", "--quiet", "--upgrade", "requests")
	if got := execOK(t, sb.ID, check...); got != "2.32.3\n" {
		t.Fatalf("upgraded: %q", got)
	}
}

func jsonRaw2(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}
