package api

import (
	"io"
	"net/http"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/image"
)

// An imported image is its project's across a cluster. The node that
// imported it records it in etcd (name, node, digest: internal/cluster);
// a create on a node that lacks it copies it from that node first, as an
// environment is copied on first use: GET /v0/cluster/images/{ref} (nodes
// only) streams the import as an OCI image layout, and the receiving node
// checks what it got against the digest etcd records before it keeps it
// (image.Store.ImportCopy). Looked up or removed through any node, an
// import is served by the node that made it, which removes the other
// nodes' copies with it.

// serveByImage serves a call about an import (GET, DELETE
// /v0/images/{ref}) on the node that made it; any other image, and an
// import this node holds (GET) or made (DELETE), here.
func (s *Server) serveByImage(w http.ResponseWriter, r *http.Request, h http.HandlerFunc) {
	ref := r.PathValue("ref")
	canon, ok := image.ImportName(ref)
	if !ok {
		h(w, r)
		return
	}
	if r.Method == http.MethodGet {
		if _, err := s.Images.Get(r.Context(), ref); err == nil {
			h(w, r)
			return
		}
	}
	p, err := s.Cluster.Image(r.Context(), canon)
	if err != nil || p.Node == s.Cluster.Name() {
		h(w, r) // here: its own answer (with etcd away, what this node has)
		return
	}
	s.proxy(w, r, p.Node, nil)
}

// dropCopies removes the other nodes' copies of img, an import this node
// made, before it is removed here. A copy that a sandbox there uses is
// not removed, and then neither is the import (image_in_use, naming the
// node). A node that cannot be reached keeps its copy until it is used:
// the cluster no longer names the import, and the copy is dropped then.
func (s *Server) dropCopies(r *http.Request, img *image.Image) error {
	others, _ := s.otherUpPeers(r.Context())
	ctx := asCaller(r)
	for _, n := range others {
		err := n.RemoveImage(ctx, img.Ref)
		switch {
		case err == nil || errdefs.Is(err, errdefs.KindNotFound):
		case errdefs.CodeOf(err) == client.CodeImageInUse:
			return errdefs.Conflict(client.CodeImageInUse, "on node %s, %v", n.Name(), err)
		default:
			s.cfgLog().Warn("cluster: a node did not remove its copy of an image", "node", n.Name(), "image", img.Ref, "err", err)
		}
	}
	return nil
}

// exportImage is GET /v0/cluster/images/{ref...} (nodes only): this node's
// import ref, of the call's project, as a tar of an OCI image layout.
func (s *Server) exportImage(w http.ResponseWriter, r *http.Request) {
	if s.Cluster == nil || fromNode(r.Context()) == "" {
		s.writeError(w, r, errdefs.New(errdefs.KindForbidden, client.CodeNodesOnly, "only another node of the cluster may call %s", r.URL.Path))
		return
	}
	lw := &lazyWriter{w: w, header: func() {
		w.Header().Set("Content-Type", "application/x-tar")
		w.WriteHeader(http.StatusOK)
	}}
	if err := s.Images.Export(r.Context(), r.PathValue("ref"), lw); err != nil {
		if !lw.started {
			s.writeError(w, r, err)
			return
		}
		// The stream is cut: the receiver's tar ends early, and it keeps
		// nothing.
		s.cfgLog().Warn("cluster: sending an image to another node failed", "image", r.PathValue("ref"), "node", fromNode(r.Context()), "err", err)
		panic(http.ErrAbortHandler)
	}
}

// lazyWriter answers with header's status on the first write only, so an
// error before anything is written is still an error answer.
type lazyWriter struct {
	w       io.Writer
	header  func()
	started bool
}

func (l *lazyWriter) Write(p []byte) (int, error) {
	if !l.started {
		l.started = true
		l.header()
	}
	return l.w.Write(p)
}
