package client

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"time"
)

// FileInfo describes one file of a sandbox.
type FileInfo struct {
	Name  string    `json:"name"`
	Path  string    `json:"path"`
	Type  string    `json:"type"` // file, dir, symlink, fifo, socket, char, block
	Size  int64     `json:"size"`
	Mode  uint32    `json:"mode"` // permission bits with setuid, setgid and sticky (07777)
	UID   int       `json:"uid"`
	GID   int       `json:"gid"`
	MTime time.Time `json:"mtime"`
	Link  string    `json:"link,omitempty"` // a symlink's target
}

// FileList is a directory's entries, sorted by name.
type FileList struct {
	Path      string     `json:"path"`
	Entries   []FileInfo `json:"entries"`
	Truncated bool       `json:"truncated"` // there were more than the limit
}

// WriteResult is what a write of files did. Notes say what was sanitised
// or skipped (a setuid bit removed, a device node left out).
type WriteResult struct {
	Path  string   `json:"path"`
	Bytes int64    `json:"bytes"` // file bytes written: a sparse file's data, not its size
	Files int      `json:"files"`
	Notes []string `json:"notes,omitempty"`
}

// WriteFileOptions say how WriteFile writes one file. Nil fields keep the
// replaced file's (or give a new one mode 0644, owner root).
type WriteFileOptions struct {
	Mode    *uint32   // 07777 at most
	UID     *int      //
	GID     *int      //
	MTime   time.Time // zero: now
	Parents bool      // make missing parent directories
}

// TarMediaType is the media type of an archive of a sandbox's files.
const TarMediaType = "application/x-tar"

// FileStatHeader is the response header that carries a read's FileInfo
// (base64 of its JSON).
const FileStatHeader = "X-Shard-File-Stat"

func filesPath(sandbox, op string, q url.Values) string {
	return "/sandboxes/" + esc(sandbox) + "/files" + op + "?" + q.Encode()
}

// StatFile describes path in a sandbox (running or stopped); with
// followLink, what a symlink there names.
func (c *Client) StatFile(ctx context.Context, sandbox, path string, followLink bool) (*FileInfo, error) {
	q := url.Values{"path": {path}}
	if followLink {
		q.Set("follow_link", "true")
	}
	var out FileInfo
	if err := c.call(ctx, "GET", filesPath(sandbox, "/stat", q), nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListFiles lists the directory path in a sandbox.
func (c *Client) ListFiles(ctx context.Context, sandbox, path string) (*FileList, error) {
	var out FileList
	if err := c.call(ctx, "GET", filesPath(sandbox, "/list", url.Values{"path": {path}}), nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// RemoveFile removes path in a sandbox; a directory that holds anything
// only with recursive. It returns what was removed.
func (c *Client) RemoveFile(ctx context.Context, sandbox, path string, recursive bool) (*FileInfo, error) {
	q := url.Values{"path": {path}}
	if recursive {
		q.Set("recursive", "true")
	}
	var out FileInfo
	if err := c.call(ctx, "DELETE", filesPath(sandbox, "", q), nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ReadFile streams the bytes of the file at path in a sandbox (a symlink
// is followed). The caller closes the reader; a read that broke off ends
// in an error, never in a clean io.EOF.
func (c *Client) ReadFile(ctx context.Context, sandbox, path string) (io.ReadCloser, *FileInfo, error) {
	return c.read(ctx, sandbox, path, false, url.Values{})
}

// ReadArchive streams a tar of path in a sandbox: a directory with what it
// holds (or one file), its entries named from path's last element. With
// followLink, or a path that ends in / or /., a symlink at path is
// archived as what it names.
func (c *Client) ReadArchive(ctx context.Context, sandbox, path string, followLink bool) (io.ReadCloser, *FileInfo, error) {
	return c.read(ctx, sandbox, path, true, linkQuery(followLink))
}

// ReadSparseArchive is ReadArchive with each file that has holes sent as
// its data, which is what shard cp unpacks: the entry of such a file holds
// the bytes of its data regions in order, and two PAX records say where
// they go, SparseSizeRecord (the file's size) and SparseExtentsRecord (its
// data regions, "offset:length" comma-separated, in order, each whole
// blocks of 4096 bytes but one that ends at the file's end); the rest of
// the file is holes. Other tar tools do not know these records. A running
// sandbox started by an older shard sends every file whole.
func (c *Client) ReadSparseArchive(ctx context.Context, sandbox, path string, followLink bool) (io.ReadCloser, *FileInfo, error) {
	q := linkQuery(followLink)
	q.Set("sparse", "true")
	return c.read(ctx, sandbox, path, true, q)
}

// The PAX records of a sparse file's tar entry (ReadSparseArchive).
const (
	SparseSizeRecord    = "SHARD.size"
	SparseExtentsRecord = "SHARD.extents"
)

func linkQuery(follow bool) url.Values {
	q := url.Values{}
	if follow {
		q.Set("follow_link", "true")
	}
	return q
}

func (c *Client) read(ctx context.Context, sandbox, path string, asTar bool, q url.Values) (io.ReadCloser, *FileInfo, error) {
	q.Set("path", path)
	req, err := c.newRequest(ctx, "GET", filesPath(sandbox, "", q), nil)
	if err != nil {
		return nil, nil, err
	}
	if asTar {
		req.Header.Set("Accept", TarMediaType)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, nil, c.connErr(err)
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		return nil, nil, readError(resp)
	}
	var info FileInfo
	if b, err := base64.StdEncoding.DecodeString(resp.Header.Get(FileStatHeader)); err == nil {
		json.Unmarshal(b, &info)
	}
	return resp.Body, &info, nil
}

// WriteFile writes what r holds at path in a sandbox (running or stopped),
// replacing a file there whole: nothing is written unless all of r
// arrives. r is streamed, never held in memory.
func (c *Client) WriteFile(ctx context.Context, sandbox, path string, r io.Reader, o *WriteFileOptions) (*WriteResult, error) {
	return c.write(ctx, sandbox, fileQuery(path, o), r, "application/octet-stream")
}

// WriteSparseFile is WriteFile for a file sent as a tar of it: one regular
// entry, which may be sparse (as ReadSparseArchive sends one), whose holes
// stay holes. Only the entry's data is used: o gives the file's mode,
// owner and time, as to WriteFile. A running sandbox started by an older
// shard refuses it (CodeUnsupported): send the file whole there.
func (c *Client) WriteSparseFile(ctx context.Context, sandbox, path string, r io.Reader, o *WriteFileOptions) (*WriteResult, error) {
	q := fileQuery(path, o)
	q.Set("sparse", "true")
	return c.write(ctx, sandbox, q, r, "application/octet-stream")
}

// fileQuery is the query of a file's write.
func fileQuery(path string, o *WriteFileOptions) url.Values {
	q := url.Values{"path": {path}}
	if o != nil {
		if o.Mode != nil {
			q.Set("mode", strconv.FormatUint(uint64(*o.Mode), 8))
		}
		if o.UID != nil {
			q.Set("uid", strconv.Itoa(*o.UID))
		}
		if o.GID != nil {
			q.Set("gid", strconv.Itoa(*o.GID))
		}
		if !o.MTime.IsZero() {
			q.Set("mtime", o.MTime.UTC().Format(time.RFC3339Nano))
		}
		if o.Parents {
			q.Set("parents", "true")
		}
	}
	return q
}

// WriteArchive unpacks the tar r into the directory dir of a sandbox (made
// if missing), its entries keeping their owner, mode and times. Entries
// that would land outside dir are refused; device nodes are skipped and
// setuid bits removed (said in the result's Notes).
func (c *Client) WriteArchive(ctx context.Context, sandbox, dir string, r io.Reader) (*WriteResult, error) {
	return c.write(ctx, sandbox, url.Values{"path": {dir}}, r, TarMediaType)
}

// WriteSparseArchive is WriteArchive for a tar that may hold sparse
// entries (as ReadSparseArchive sends them), whose holes stay holes. A
// running sandbox started by an older shard refuses it (CodeUnsupported):
// send the tar with whole files there.
func (c *Client) WriteSparseArchive(ctx context.Context, sandbox, dir string, r io.Reader) (*WriteResult, error) {
	return c.write(ctx, sandbox, url.Values{"path": {dir}, "sparse": {"true"}}, r, TarMediaType)
}

func (c *Client) write(ctx context.Context, sandbox string, q url.Values, r io.Reader, ctype string) (*WriteResult, error) {
	req, err := c.newRequest(ctx, "PUT", filesPath(sandbox, "", q), r)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", ctype)
	if f, ok := r.(*os.File); ok && req.ContentLength == 0 {
		// A regular file's length is known: the server checks it arrived whole.
		if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() {
			if off, err := f.Seek(0, io.SeekCurrent); err == nil {
				req.ContentLength = fi.Size() - off
				if req.ContentLength == 0 {
					req.Body = http.NoBody
				}
			}
		}
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, c.connErr(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		return nil, readError(resp)
	}
	var out WriteResult
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("decode the server's answer: %w", err)
	}
	return &out, nil
}
