// Package project carries a request's project: the namespace that every
// sandbox, checkpoint, snapshot, environment, ledger session, secret, token
// and imported image belongs to. A key of one project never sees another's
// objects; the store filters every lookup by the project its context
// carries, so a path that forgets to check cannot leak.
//
// A context says what it may see in one of two ways: With (one project) or
// Unscoped (every project, for the server's own work, with a reason). A
// context that says neither sees nothing, and the store refuses it
// (Require): a forgotten marker fails closed, never open.
package project

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/useshards/shard/internal/names"
)

// Default is the project of the data a server had before projects, and of
// a request that names none.
const Default = "default"

// Nowhere is the project of a context that carries no project: no object
// belongs to it (Check refuses the name), so a lookup in it finds nothing
// and only an unscoped context sees what is made in it.
const Nowhere = "-"

// ErrNoProject is the error of store work under a context that carries no
// project: an internal error, the bug of the caller that lost it.
var ErrNoProject = errors.New("no project: the context says neither the project it acts in nor that it is the server's own work")

// Check checks a project's name (the rule of sandbox names).
func Check(name string) error { return names.Name("project", name) }

type ctxKey struct{}

// underTest reports whether a lost project marker panics: in a test
// binary, and in a server started with SHARD_STRICT_PROJECTS=1 (the
// integration tests' servers, so that a path only they reach cannot lose
// its marker quietly). A variable so that this package's tests can also
// see what a server (which does not panic) does.
var underTest = func() bool { return testing.Testing() || strictProjects }

// strictProjects is SHARD_STRICT_PROJECTS=1, read once.
var strictProjects = os.Getenv("SHARD_STRICT_PROJECTS") == "1"

// marker is what a context carries: one project, or every one and why.
// Neither (a With of "") is a context that sees nothing.
type marker struct {
	project string
	all     bool
	why     string // why a context sees every project (for logs and debugging)
}

// With returns ctx scoped to the project name: lookups see its objects only
// and new objects are made in it. An empty name is a bug (Unscoped is how
// to see every project), and so is Nowhere (the project of a context that
// lost its own, which With must not make good again): either panics under
// test, and otherwise gives a context that sees nothing and that the
// store refuses.
func With(ctx context.Context, name string) context.Context {
	if name == Nowhere {
		name = ""
	}
	if name == "" && underTest() {
		panic("project.With(ctx, \"\"): use project.Unscoped(ctx, why) to see every project")
	}
	return context.WithValue(ctx, ctxKey{}, marker{project: name})
}

// Unscoped returns ctx seeing every project: the server's own work
// (reconcile, the watcher, the sweeps) and an administrator's list of all.
// why says what the work is; it is kept for logs and debugging (Why).
func Unscoped(ctx context.Context, why string) context.Context {
	if why == "" && underTest() {
		panic("project.Unscoped(ctx, \"\"): say why the context sees every project")
	}
	return context.WithValue(ctx, ctxKey{}, marker{all: true, why: why})
}

// Why returns the reason ctx was made Unscoped, and whether it was.
func Why(ctx context.Context) (string, bool) {
	m, _ := ctx.Value(ctxKey{}).(marker)
	return m.why, m.all
}

// Require returns ErrNoProject unless ctx is scoped to a project or
// Unscoped. Under test a context with no marker at all panics, so that
// the test names the path that lost it.
func Require(ctx context.Context) error {
	m, ok := ctx.Value(ctxKey{}).(marker)
	switch {
	case !ok && underTest():
		panic(ErrNoProject)
	case !ok:
		return ErrNoProject
	case !m.all && m.project == "":
		return fmt.Errorf("%w (it was scoped to no project name)", ErrNoProject)
	}
	return nil
}

// From returns the project ctx is scoped to, and whether it is scoped at
// all. The server's own work runs Unscoped and sees every project; every
// API request is scoped. A context with no marker (or With "") is scoped
// to Nowhere: it sees nothing.
func From(ctx context.Context) (string, bool) {
	m, ok := ctx.Value(ctxKey{}).(marker)
	switch {
	case ok && m.all:
		return "", false
	case ok && m.project != "":
		return m.project, true
	}
	return Nowhere, true
}

// Of returns the project a new object made under ctx belongs to: ctx's,
// Default for the server's own work, or Nowhere for a context with no
// project (which the store refuses).
func Of(ctx context.Context) string {
	if p, ok := From(ctx); ok {
		return p
	}
	return Default
}

// OrDefault is p, or Default for a record that names none (one made
// before projects, or not yet stored).
func OrDefault(p string) string {
	if p == "" {
		return Default
	}
	return p
}

// Visible reports whether an object of project p may be seen under ctx:
// always when Unscoped, in its own project when scoped, never without a
// marker.
func Visible(ctx context.Context, p string) bool {
	want, ok := From(ctx)
	return !ok || (want != Nowhere && want == OrDefault(p))
}
