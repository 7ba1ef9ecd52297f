package sandbox

import (
	"context"
	"path/filepath"
	"slices"
	"time"

	"github.com/useshards/shard/internal/agent"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/ledger"
	"github.com/useshards/shard/internal/store"
)

// GrantRequest gives a secret to a sandbox: as the environment variable Env
// of every exec, or as the file File (written now, into its files).
type GrantRequest struct {
	Secret string
	Env    string
	File   string
}

// Grant gives a secret to a sandbox. An env grant applies to every exec
// from now on (the value is read at each exec, never stored in the sandbox's
// record or the ledger); a file grant writes the file into the running
// sandbox (mode 0400, root's). Granting the same secret again replaces the
// grant.
func (s *Service) Grant(ctx context.Context, idOrName string, req GrantRequest) (*store.Sandbox, error) {
	if s.cfg.Secrets == nil {
		return nil, errdefs.Unsupported("this server keeps no secrets")
	}
	if _, err := s.cfg.Secrets.Get(ctx, req.Secret); err != nil {
		return nil, err
	}
	switch {
	case req.Env != "" && req.File != "":
		return nil, errdefs.Invalid("grant %s as an env variable or as a file, not both", req.Secret)
	case req.File != "":
		if !filepath.IsAbs(req.File) || filepath.Clean(req.File) != req.File || req.File == "/" {
			return nil, errdefs.Invalid("file %q must be a clean absolute path", req.File)
		}
	default:
		if req.Env == "" {
			req.Env = req.Secret
		}
		if !envRe.MatchString(req.Env + "=") { // envRe checks the K= of K=V
			return nil, errdefs.Invalid("%q is not an environment variable name: give one with --env, or grant it as a file with --file", req.Env)
		}
	}
	sb, unlock, err := s.lockSandbox(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	defer unlock()
	old := grantOf(sb, req.Secret)
	if req.File != "" || (old != nil && old.File != "") {
		if sb.State != StateRunning {
			return nil, errdefs.Conflict("sandbox_not_running", "sandbox %s is %s: a file grant is written into (and removed from) a running sandbox: start it first", sb.Name, sb.State)
		}
	}
	if old != nil && old.File != "" && old.File != req.File {
		if err := s.removeFile(ctx, sb, old.File); err != nil {
			return nil, err
		}
	}
	if req.File != "" {
		value, err := s.cfg.Secrets.Value(ctx, req.Secret)
		if err != nil {
			return nil, err
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err = s.agentFor(sb).Do(cctx, agent.Request{Op: agent.OpPutFile, Path: req.File, Data: value, Mode: 0o400})
		cancel()
		if err != nil {
			return nil, errdefs.Unavailable("grant_failed", "write %s in sandbox %s: %v", req.File, sb.Name, err)
		}
	}
	g := store.Grant{Secret: req.Secret, Env: req.Env, File: req.File, At: time.Now().UTC()}
	if req.File != "" {
		g.Env = ""
	}
	return s.cfg.Store.UpdateSandbox(ctx, sb.ID, func(r *store.Sandbox) (*store.EventSpec, error) {
		r.Grants = slices.DeleteFunc(r.Grants, func(x store.Grant) bool { return x.Secret == req.Secret })
		r.Grants = append(r.Grants, g)
		return &store.EventSpec{Type: ledger.SecretGranted, Data: ledger.GrantData{Secret: g.Secret, Env: g.Env, File: g.File}}, nil
	})
}

// Ungrant takes a secret away from a sandbox: new execs no longer get the
// variable; a granted file is removed. Its forks keep their own grants.
func (s *Service) Ungrant(ctx context.Context, idOrName, secret string) (*store.Sandbox, error) {
	sb, unlock, err := s.lockSandbox(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	defer unlock()
	g := grantOf(sb, secret)
	if g == nil {
		return nil, errdefs.NotFound("grant_not_found", "sandbox %s has no grant of secret %s", sb.Name, secret)
	}
	if g.File != "" {
		if sb.State != StateRunning {
			return nil, errdefs.Conflict("sandbox_not_running", "sandbox %s is %s: a file grant is removed from a running sandbox: start it first", sb.Name, sb.State)
		}
		if err := s.removeFile(ctx, sb, g.File); err != nil {
			return nil, err
		}
	}
	return s.cfg.Store.UpdateSandbox(ctx, sb.ID, func(r *store.Sandbox) (*store.EventSpec, error) {
		r.Grants = slices.DeleteFunc(r.Grants, func(x store.Grant) bool { return x.Secret == secret })
		return &store.EventSpec{Type: ledger.SecretUngranted, Data: map[string]string{"secret": secret}}, nil
	})
}

func (s *Service) removeFile(ctx context.Context, sb *store.Sandbox, path string) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := s.agentFor(sb).Do(cctx, agent.Request{Op: agent.OpRemoveFile, Path: path}); err != nil {
		return errdefs.Unavailable("grant_failed", "remove %s in sandbox %s: %v", path, sb.Name, err)
	}
	return nil
}

func grantOf(sb *store.Sandbox, secret string) *store.Grant {
	for i := range sb.Grants {
		if sb.Grants[i].Secret == secret {
			return &sb.Grants[i]
		}
	}
	return nil
}

// grantEnv resolves a sandbox's env grants into K=V for an exec. A secret
// removed since its grant gives nothing.
func (s *Service) grantEnv(ctx context.Context, sb *store.Sandbox) ([]string, error) {
	var out []string
	for _, g := range sb.Grants {
		if g.Env == "" || s.cfg.Secrets == nil {
			continue
		}
		v, err := s.cfg.Secrets.Value(ctx, g.Secret)
		if errdefs.Is(err, errdefs.KindNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, g.Env+"="+string(v))
	}
	return out, nil
}

func copyGrants(g []store.Grant) []store.Grant { return slices.Clone(g) }

func copyPolicy(p *store.Policy) *store.Policy {
	if p == nil {
		return nil
	}
	return &store.Policy{DenyAll: p.DenyAll, Allow: slices.Clone(p.Allow), Deny: slices.Clone(p.Deny)}
}
