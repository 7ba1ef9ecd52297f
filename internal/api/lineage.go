package api

import (
	"net/http"

	"github.com/useshards/shard/internal/lineage"
	"github.com/useshards/shard/internal/sandbox"
)

// Tree is the fork tree: every lineage, or the one a sandbox is in.
type Tree struct {
	Roots []*lineage.Node `json:"roots"`
}

func (s *Server) tree(r *http.Request) (any, int, error) {
	all, err := boolQuery(r, "all")
	if err != nil {
		return nil, 0, err
	}
	roots, err := s.Lineage.Tree(r.Context(), r.PathValue("id"), all)
	if err != nil {
		return nil, 0, err
	}
	if roots == nil {
		roots = []*lineage.Node{}
	}
	return Tree{Roots: roots}, 200, nil
}

func (s *Server) diff(r *http.Request) (any, int, error) {
	patch, err := boolQuery(r, "patch")
	if err != nil {
		return nil, 0, err
	}
	if patch {
		for _, id := range []string{r.PathValue("id"), r.URL.Query().Get("against")} {
			if id == "" {
				continue
			}
			if err := s.mayReadContents(r, id); err != nil {
				return nil, 0, err
			}
		}
	}
	res, err := s.Lineage.Diff(r.Context(), r.PathValue("id"), sandbox.DiffOptions{Against: r.URL.Query().Get("against"), Patch: patch})
	if err != nil {
		return nil, 0, err
	}
	return res, 200, nil
}
