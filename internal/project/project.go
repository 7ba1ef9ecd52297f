// Package project carries a request's project: the namespace that every
// sandbox, checkpoint, snapshot, environment, ledger session, secret, token
// and imported image belongs to. A key of one project never sees another's
// objects; the store filters every lookup by the project its context
// carries, so a path that forgets to check cannot leak.
package project

import (
	"context"

	"github.com/useshards/shard/internal/names"
)

// Default is the project of the data a server had before projects, and of
// a request that names none.
const Default = "default"

// Check checks a project's name (the rule of sandbox names).
func Check(name string) error { return names.Name("project", name) }

type ctxKey struct{}

// marker is what a context carries: one project, or every one and why.
type marker struct {
	project string
	all     bool
	why     string // why a context sees every project (for logs and debugging)
}

// With returns ctx scoped to the project name: lookups see its objects only
// and new objects are made in it. With "" it is unscoped again: it sees
// every project (Unscoped says why, and is how new code says it).
func With(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, ctxKey{}, marker{project: name, all: name == ""})
}

// Unscoped returns ctx seeing every project: the server's own work
// (reconcile, the watcher, spares) and an administrator's list of all.
// why says what the work is; it is kept for logs and debugging (Why).
func Unscoped(ctx context.Context, why string) context.Context {
	return context.WithValue(ctx, ctxKey{}, marker{all: true, why: why})
}

// Why returns the reason ctx was made Unscoped, and whether it was.
func Why(ctx context.Context) (string, bool) {
	m, _ := ctx.Value(ctxKey{}).(marker)
	return m.why, m.all
}

// From returns the project ctx is scoped to, and whether it is scoped at
// all. The server's own work (reconcile, the watcher, spares) runs
// unscoped and sees every project; every API request is scoped.
func From(ctx context.Context) (string, bool) {
	m, _ := ctx.Value(ctxKey{}).(marker)
	return m.project, m.project != ""
}

// Of returns the project a new object made under ctx belongs to: ctx's, or
// Default for the server's own work.
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

// Visible reports whether an object of project p may be seen under ctx.
func Visible(ctx context.Context, p string) bool {
	want, ok := From(ctx)
	return !ok || want == OrDefault(p)
}
