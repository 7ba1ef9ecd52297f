package api

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/auth"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/files"
	"github.com/useshards/shard/internal/sandbox"
)

// TarMediaType asks for, or sends, a tar of a sandbox's files.
const TarMediaType = "application/x-tar"

// FileStatHeader carries, on a read of a sandbox's files, the FileInfo of
// what is read: base64 (standard, padded) of its JSON, as docker's
// X-Docker-Container-Path-Stat (a path may hold any byte).
const FileStatHeader = "X-Shard-File-Stat"

// filePath reads ?path=, which every files route needs.
func filePath(r *http.Request) (string, error) {
	p := r.URL.Query().Get("path")
	if p == "" {
		return "", errdefs.New(errdefs.KindInvalid, files.CodeInvalid, "give the file's path in the sandbox: ?path=/ABSOLUTE/PATH")
	}
	return p, nil
}

// readFiles answers a file's bytes or, asked for application/x-tar, a tar
// of the path (a directory with what it holds), streamed as the sandbox
// reads it.
func (s *Server) readFiles(w http.ResponseWriter, r *http.Request) {
	p, err := filePath(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	o, err := readOptions(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := s.mayReadContents(r, r.PathValue("id")); err != nil {
		s.writeError(w, r, err)
		return
	}
	st, err := s.Files.ReadFiles(r.Context(), r.PathValue("id"), p, o)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer st.Close()
	info, _ := json.Marshal(st.Info)
	h := w.Header()
	h.Set(FileStatHeader, base64.StdEncoding.EncodeToString(info))
	h.Set("Last-Modified", st.Info.MTime.UTC().Format(http.TimeFormat))
	if o.Tar {
		h.Set("Content-Type", TarMediaType)
	} else {
		h.Set("Content-Type", "application/octet-stream")
		// A client that gets fewer bytes knows the read broke off.
		h.Set("Content-Length", strconv.FormatInt(st.Info.Size, 10))
	}
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	rc := http.NewResponseController(w)
	// The head goes out now, not with the first bytes: a tar of a file
	// whose holes are found by reading it sends nothing until that is done.
	rc.Flush()
	// A download to a client that reads nothing must not hold a shutdown
	// up: a second after it begins, the write in flight is cut.
	defer s.onStopping(func() { rc.SetWriteDeadline(time.Now().Add(time.Second)) })()
	if _, err := io.CopyBuffer(w, st, make([]byte, 1<<20)); err != nil {
		if r.Context().Err() == nil {
			s.Log.Warn("files: read broke off", "sandbox", r.PathValue("id"), "path", p, "err", err)
		}
		// The status is sent: breaking the connection is how the client
		// learns the bytes are not whole (a tar has no length to check).
		panic(http.ErrAbortHandler)
	}
}

// readOptions reads what a read asks for: a tar (by its Accept), a
// symlink followed, sparse files as their data.
func readOptions(r *http.Request) (o files.GetOptions, err error) {
	o.Tar = acceptsMedia(r, TarMediaType)
	if o.Follow, err = boolQuery(r, "follow_link"); err != nil {
		return o, err
	}
	if o.Sparse, err = boolQuery(r, "sparse"); err != nil {
		return o, err
	}
	if o.Sparse && !o.Tar {
		return o, errdefs.Invalid("sparse=true is for a tar: ask for one (Accept: %s)", TarMediaType)
	}
	return o, nil
}

// acceptsMedia reports whether the request's Accept names typ.
func acceptsMedia(r *http.Request, typ string) bool {
	for _, v := range r.Header.Values("Accept") {
		for _, part := range splitComma(v) {
			if mediaType(part) == typ {
				return true
			}
		}
	}
	return false
}

func splitComma(v string) []string {
	var out []string
	start := 0
	for i := 0; i <= len(v); i++ {
		if i == len(v) || v[i] == ',' {
			out = append(out, v[start:i])
			start = i + 1
		}
	}
	return out
}

// writeFiles writes the body at ?path= (a file), or unpacks it there (a
// tar, sent as application/x-tar).
func (s *Server) writeFiles(r *http.Request) (any, int, error) {
	p, err := filePath(r)
	if err != nil {
		return nil, 0, err
	}
	o := sandbox.WriteOptions{Mode: -1, UID: -1, GID: -1, Size: r.ContentLength,
		Tar: mediaType(r.Header.Get("Content-Type")) == TarMediaType}
	q := r.URL.Query()
	if v := q.Get("mode"); v != "" {
		m, err := strconv.ParseUint(v, 8, 32)
		if err != nil || m > 0o7777 {
			return nil, 0, errdefs.Invalid("mode=%q: give the file's mode in octal, at most 7777 (e.g. 644)", v)
		}
		o.Mode = int64(m)
	}
	for _, id := range []struct {
		key string
		to  *int
	}{{"uid", &o.UID}, {"gid", &o.GID}} {
		n, err := intQuery(r, id.key, -1, 0, 1<<31-2)
		if err != nil {
			return nil, 0, err
		}
		*id.to = int(n)
	}
	if v := q.Get("mtime"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return nil, 0, errdefs.Invalid("mtime=%q: give an RFC 3339 time (e.g. 2026-01-02T15:04:05Z)", v)
		}
		o.MTime = t
	}
	if o.Parents, err = boolQuery(r, "parents"); err != nil {
		return nil, 0, err
	}
	if o.Sparse, err = boolQuery(r, "sparse"); err != nil {
		return nil, 0, err
	}
	if o.Tar && (o.Mode >= 0 || o.UID >= 0 || o.GID >= 0 || !o.MTime.IsZero()) {
		return nil, 0, errdefs.Invalid("mode, uid, gid and mtime are a file's: a tar's entries carry their own")
	}
	if o.Tar || o.Sparse {
		o.Size = -1 // a tar's length, not a file's (a sparse file's body is a tar of it)
	}
	res, err := s.Files.WriteFiles(r.Context(), r.PathValue("id"), p, r.Body, o)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, 0, errdefs.New(errdefs.KindTooLarge, client.CodeTooLarge, "%v", err)
		}
		return nil, 0, err
	}
	return res, 200, nil
}

func (s *Server) statFile(r *http.Request) (any, int, error) {
	p, err := filePath(r)
	if err != nil {
		return nil, 0, err
	}
	follow, err := boolQuery(r, "follow_link")
	if err != nil {
		return nil, 0, err
	}
	in, err := s.Files.StatFile(r.Context(), r.PathValue("id"), p, follow)
	if err != nil {
		return nil, 0, err
	}
	return in, 200, nil
}

// FileList is a directory's entries.
type FileList struct {
	Path      string       `json:"path"`
	Entries   []files.Info `json:"entries"`
	Truncated bool         `json:"truncated"`
}

func (s *Server) listFiles(r *http.Request) (any, int, error) {
	p, err := filePath(r)
	if err != nil {
		return nil, 0, err
	}
	limit, err := intQuery(r, "limit", files.DefaultListLimit, 1, files.DefaultListLimit)
	if err != nil {
		return nil, 0, err
	}
	ents, trunc, err := s.Files.ListFiles(r.Context(), r.PathValue("id"), p, int(limit))
	if err != nil {
		return nil, 0, err
	}
	clean, _ := files.CheckPath(p)
	return FileList{Path: clean, Entries: ents, Truncated: trunc}, 200, nil
}

func (s *Server) removeFile(r *http.Request) (any, int, error) {
	p, err := filePath(r)
	if err != nil {
		return nil, 0, err
	}
	rec, err := boolQuery(r, "recursive")
	if err != nil {
		return nil, 0, err
	}
	in, err := s.Files.RemoveFile(r.Context(), r.PathValue("id"), p, rec)
	if err != nil {
		return nil, 0, err
	}
	return in, 200, nil
}

// mayReadContents refuses a read of a sandbox's file contents to a key
// that may not run commands in it (sandbox:write) when the sandbox holds
// secret grants: a granted file, or a process's environment in /proc, is
// the secret's value, which only those who can exec may see.
func (s *Server) mayReadContents(r *http.Request, idOrName string) error {
	p := auth.From(r.Context())
	if p.Can(auth.SandboxWrite) {
		return nil
	}
	sb, err := s.Sandboxes.Get(r.Context(), idOrName)
	if err != nil {
		return err
	}
	if len(sb.Grants) == 0 {
		return nil
	}
	return errdefs.New(errdefs.KindForbidden, client.CodeMissingScope,
		"sandbox %s holds secret grants: reading its files' contents needs sandbox:write, the scope that runs commands in it (token %s lacks it)", sb.Name, p.Name)
}
