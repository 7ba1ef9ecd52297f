package image

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"runtime"
	"strings"
	"syscall"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/project"
)

// Pull fetches ref from its registry (through the mirrors, for Docker Hub)
// and installs it. It always asks the registry what the reference points
// to now; layers already unpacked are reused, not downloaded again.
func (s *Store) Pull(ctx context.Context, ref string, progress func(Progress)) (*Image, error) {
	// The metrics count the bytes of the layers it downloaded, as the
	// progress reports them (a cached layer reports none).
	layers := map[string]int64{}
	img, err := s.pull(ctx, ref, func(p Progress) {
		// Calls come one at a time (the reporter serializes them).
		if _, seen := layers[p.Layer]; p.Layer != "" && (p.Status == StatusDownloading || seen && p.Status == StatusComplete) {
			layers[p.Layer] = max(layers[p.Layer], p.LayerDone)
		}
		if progress != nil {
			progress(p)
		}
	})
	var n int64
	for _, b := range layers {
		n += b
	}
	s.metrics.Pull(n, err)
	if err != nil {
		s.pullFailed(ctx, ref, err)
	}
	return img, s.public(err, nil)
}

// CheckPull refuses, before anything is connected, a pull of ref that
// cannot be made: a malformed reference (400), a registry this server does
// not pull from (403 registry_not_allowed, logged). Pull checks the same.
func (s *Store) CheckPull(ctx context.Context, ref string) error {
	_, err := s.checkPull(ctx, ref)
	if errdefs.Is(err, errdefs.KindForbidden) {
		s.pullFailed(ctx, ref, err)
	}
	return err
}

// maxPullLog bounds what a failed pull logs of its error (which may hold
// up to go-containerregistry's bound of a registry's error answer).
const maxPullLog = 2048

// pullFailed logs a failed pull: its error reaches the user in a stream
// or a create's answer, in words that leave the cause out (a refused
// address, what a network error was), and the operator sees it here.
func (s *Store) pullFailed(ctx context.Context, ref string, err error) {
	if errdefs.Is(err, errdefs.KindCanceled) {
		// Its client left: nothing failed.
		s.log.Debug("pull canceled", "image", clip(ref, 256), "project", project.Of(ctx))
		return
	}
	text := err.Error()
	if e, ok := errdefs.As(err); ok && e.Err != nil && e.Msg != "" {
		text += ": " + e.Err.Error()
	}
	s.log.Warn("pull failed", "image", clip(ref, 256), "project", project.Of(ctx), "code", errdefs.CodeOf(err), "err", clip(text, maxPullLog))
}

// clip is s cut to at most n bytes, saying how long it was.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + fmt.Sprintf("...[%d bytes]", len(s))
}

func (s *Store) checkPull(ctx context.Context, ref string) (name.Reference, error) {
	if strings.HasPrefix(strings.TrimSpace(ref), "sha256:") {
		return nil, errdefs.Invalid("cannot pull %q: an image ID is not a reference; give a name such as python:3.12", ref)
	}
	r, err := s.parseRef(ref)
	if err != nil {
		return nil, err
	}
	return r, s.guard.check(ctx, r, familiar(r))
}

// errPullTimeout is the cause of a pull's context ending at PullTimeout.
var errPullTimeout = errors.New("pull timed out")

func (s *Store) pull(ctx context.Context, ref string, progress func(Progress)) (*Image, error) {
	r, err := s.checkPull(ctx, ref)
	if err != nil {
		return nil, err
	}
	what := familiar(r)
	ctx, cancel := context.WithTimeoutCause(ctx, s.pullTime, errPullTimeout)
	defer cancel()
	img, err := s.pullRef(ctx, r, what, progress)
	if err != nil && errors.Is(context.Cause(ctx), errPullTimeout) {
		return nil, &errdefs.Error{Kind: errdefs.KindTimeout, Code: codeTimeout, Err: err, // logged by Pull
			Msg: fmt.Sprintf("pulling %q timed out after %s (shard serve --pull-timeout)", what, s.pullTime)}
	}
	return img, err
}

func (s *Store) pullRef(ctx context.Context, r name.Reference, what string, progress func(Progress)) (*Image, error) {
	rep := &reporter{fn: progress}
	rep.send(Progress{Status: StatusResolving})
	desc, from, err := s.fetch(ctx, r, what)
	if err != nil {
		return nil, err
	}
	registry := from.Context().RegistryStr()
	src, err := remoteSource(desc, what)
	if err != nil {
		return nil, classify(ctx, err, what, registry)
	}
	in, err := s.install(ctx, src, rep)
	if err != nil {
		return nil, classify(ctx, err, what, registry)
	}
	defer s.unpin(in.pins...)
	imgs, err := s.commit([]string{canonical(r)}, in)
	if err != nil {
		return nil, err
	}
	rep.send(Progress{Status: StatusDone})
	s.log.Info("pulled image", "image", what, "digest", in.digest, "from", registry)
	return imgs[0], nil
}

// fetch resolves the reference, trying each mirror in turn for Docker Hub
// images and then the registry itself. Mirror failures are logged; the
// error returned is the registry's own, except that on a machine that cannot
// reach the registry a mirror's "not found" is the better answer (offline,
// a mistyped tag must not read as a network problem).
func (s *Store) fetch(ctx context.Context, r name.Reference, what string) (*remote.Descriptor, name.Reference, error) {
	var tries []name.Reference
	hub := r.Context().RegistryStr() == name.DefaultRegistry
	if hub {
		for _, m := range s.mirrors {
			tries = append(tries, m.rebase(r))
		}
	}
	// Docker Hub itself is skipped when only the mirrors may serve it.
	if !hub || !s.guard.only || s.guard.isListed(name.DefaultRegistry) || s.guard.listed[name.DefaultRegistry] {
		tries = append(tries, r)
	}
	var err, mirrorNotFound error
	for i, t := range tries {
		desc, gerr := remote.Get(t, s.remoteOptions(ctx, t.Context().Registry)...)
		if gerr == nil {
			return desc, t, nil
		}
		err = classify(ctx, gerr, what, t.Context().RegistryStr())
		if ctx.Err() != nil {
			return nil, nil, err
		}
		if i < len(tries)-1 {
			if mirrorNotFound == nil && errdefs.Is(err, errdefs.KindNotFound) {
				mirrorNotFound = err
			}
			s.log.Warn("registry mirror failed, trying the next source", "mirror", t.Context().RegistryStr(), "image", what, "err", gerr)
		}
	}
	if k := errdefs.KindOf(err); mirrorNotFound != nil && (k == errdefs.KindUpstream || k == errdefs.KindTimeout) {
		return nil, nil, errdefs.NotFound(client.CodeImageNotFound, "%v (and %v)", mirrorNotFound, err)
	}
	return nil, nil, err
}

func (s *Store) remoteOptions(ctx context.Context, reg name.Registry) []remote.Option {
	return []remote.Option{
		remote.WithContext(ctx),
		remote.WithAuthFromKeychain(authn.DefaultKeychain),
		remote.WithTransport(s.transportFor(reg)),
		remote.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH, Variant: defaultVariant()}),
		remote.WithUserAgent("shard"),
		remote.WithRetryPredicate(retryable),
	}
}

// retryable is go-containerregistry's own rule of which errors a request
// is tried again for, but for timeouts: a host that did not answer in time
// once is not waited for three more times.
func retryable(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary() ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, net.ErrClosed)
}

// remoteSource turns a registry descriptor into an installable source,
// picking this machine's platform from a multi-arch index.
func remoteSource(desc *remote.Descriptor, what string) (*source, error) {
	src := &source{what: what, digest: desc.Digest.String()}
	var img v1.Image
	var err error
	if desc.MediaType.IsIndex() {
		src.index = desc.Manifest
		idx, ierr := desc.ImageIndex()
		if ierr != nil {
			return nil, ierr
		}
		img, err = imageFromIndex(idx, what, checkDoc)
	} else {
		img, err = desc.Image()
	}
	if err != nil {
		return nil, err
	}
	return imageSource(src, img, checkDoc)
}

// docCheck refuses a document (a manifest, an index, a config) over limit
// before it is read whole: by its descriptor, and for a layout by its file.
type docCheck func(d v1.Descriptor, doc string, limit int64) error

// imageSource fills src from an image whose layers are stored compressed
// (registry, OCI layout).
func imageSource(src *source, img v1.Image, check docCheck) (*source, error) {
	var err error
	if src.manifest, err = img.RawManifest(); err != nil {
		return nil, err
	}
	m, err := img.Manifest()
	if err != nil {
		return nil, err
	}
	if err := check(m.Config, "config", maxConfigSize); err != nil {
		return nil, err
	}
	if src.config, err = img.RawConfigFile(); err != nil {
		return nil, err
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, err
	}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return nil, err
		}
		size, _ := l.Size()
		src.layers = append(src.layers, layerSource{id: shortHex(d.String()), digest: d.String(), size: size, open: l.Compressed})
	}
	return src, nil
}

// imageFromIndex picks the linux/GOARCH image, through nested indexes.
func imageFromIndex(idx v1.ImageIndex, what string, check docCheck) (v1.Image, error) {
	for range 4 {
		im, err := idx.IndexManifest()
		if err != nil {
			return nil, err
		}
		d, err := pickPlatform(im.Manifests, what)
		if err != nil {
			return nil, err
		}
		doc := "manifest"
		if d.MediaType.IsIndex() {
			doc = "index"
		}
		if err := check(d, doc, maxManifestSize); err != nil {
			return nil, err
		}
		if !d.MediaType.IsIndex() {
			return idx.Image(d.Digest)
		}
		if idx, err = idx.ImageIndex(d.Digest); err != nil {
			return nil, err
		}
	}
	return nil, invalidImage(nil, "image %q: its image indexes are nested too deep", what)
}

// pickPlatform chooses linux/GOARCH, preferring the default variant
// (v8 on arm64). Attestation manifests (platform unknown/unknown) are
// skipped; an index whose only image has no platform gives that image.
func pickPlatform(ds []v1.Descriptor, what string) (v1.Descriptor, error) {
	var best *v1.Descriptor
	bestScore := 0
	var seen, unlabeled []string
	var lastUnlabeled v1.Descriptor
	for i, d := range ds {
		if !d.MediaType.IsImage() && !d.MediaType.IsIndex() {
			continue
		}
		p := d.Platform
		if p == nil {
			unlabeled = append(unlabeled, d.Digest.String())
			lastUnlabeled = d
			continue
		}
		if p.OS == "unknown" {
			continue
		}
		seen = append(seen, p.String())
		if p.OS != "linux" || p.Architecture != runtime.GOARCH {
			continue
		}
		score := 1
		if p.Variant == defaultVariant() {
			score = 2
		}
		if score > bestScore {
			best, bestScore = &ds[i], score
		}
	}
	if best != nil {
		return *best, nil
	}
	if len(seen) == 0 && len(unlabeled) == 1 {
		return lastUnlabeled, nil
	}
	return v1.Descriptor{}, errdefs.NotFound(client.CodeImageNotFound, "image %q has no linux/%s variant (it has: %s)",
		what, runtime.GOARCH, strings.Join(seen, ", "))
}

func defaultVariant() string {
	switch runtime.GOARCH {
	case "arm64":
		return "v8"
	case "arm":
		return "v7"
	}
	return ""
}

// classify maps a registry failure to the errdefs class the API reports,
// with a message that says what went wrong in the user's terms.
func classify(ctx context.Context, err error, what, registry string) error {
	if err == nil {
		return nil
	}
	if _, ok := errdefs.As(err); ok {
		return err
	}
	if ctx.Err() != nil {
		return fmt.Errorf("pull %q: %w", what, ctx.Err())
	}
	if e, ok := docTooLarge(err, what); ok {
		return e
	}
	if e, ok := refusedFor(err, what, registry); ok {
		return e
	}
	if e, ok := realmRefusedFor(err, what, registry); ok {
		return e
	}
	cls := func(kind errdefs.Kind, code, format string, args ...any) error {
		return &errdefs.Error{Kind: kind, Code: code, Msg: fmt.Sprintf(format, args...), Err: err}
	}
	// What a registry sends never reaches the message: a status, a
	// well-formed error code at most. (A body could be the answer of a
	// host-only service the pull was sent to.)
	var te *transport.Error
	if errors.As(err, &te) {
		switch {
		case hasCode(te, transport.BlobUnknownErrorCode):
			return cls(errdefs.KindUpstream, client.CodeRegistryUnreachable, "registry %s is missing layer data of image %q", registry, what)
		case te.StatusCode == http.StatusNotFound || hasCode(te, transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode):
			return cls(errdefs.KindNotFound, client.CodeImageNotFound, "image %q not found in registry %s", what, registry)
		case te.StatusCode == http.StatusUnauthorized || te.StatusCode == http.StatusForbidden ||
			hasCode(te, transport.UnauthorizedErrorCode, transport.DeniedErrorCode):
			return cls(errdefs.KindForbidden, client.CodeRegistryDenied,
				"registry %s denied access to image %q: the repository may not exist, or it needs credentials (docker login %s)", registry, what, registry)
		case te.StatusCode == http.StatusTooManyRequests || hasCode(te, transport.TooManyRequestsErrorCode):
			return cls(errdefs.KindUpstream, client.CodeRegistryUnreachable, "registry %s is rate-limiting pulls of %q; try again later", registry, what)
		}
		return cls(errdefs.KindUpstream, client.CodeRegistryUnreachable, "registry %s failed while pulling %q: %s", registry, what, statusText(te))
	}
	if isNetworkError(err) {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return cls(errdefs.KindTimeout, codeTimeout, "registry %s did not answer in time while pulling %q (timed out)", registry, what)
		}
		return cls(errdefs.KindUpstream, client.CodeRegistryUnreachable, "cannot reach registry %s to pull %q: %s", registry, what, netReason(err))
	}
	// What is left is what the registry sent: a manifest, index or config
	// that does not parse or verify, a layer whose blob does not match its
	// digest. The store's own failures are classified where they happen.
	return cls(errdefs.KindFailed, codeInvalidImage, "image %q from registry %s is not a valid image: %s", what, registry, invalidReason(err))
}

// statusText is a registry's error answer as a message may show it: its
// HTTP status and the error codes it gave, if they look like codes.
func statusText(te *transport.Error) string {
	out := fmt.Sprintf("HTTP %d", te.StatusCode)
	if t := http.StatusText(te.StatusCode); t != "" {
		out += " " + t
	}
	var codes []string
	for _, d := range te.Errors {
		if c := string(d.Code); errCodeRe.MatchString(c) && len(codes) < 3 {
			codes = append(codes, c)
		}
	}
	if len(codes) > 0 {
		out += " (" + strings.Join(codes, ", ") + ")"
	}
	return out
}

var errCodeRe = regexp.MustCompile(`^[A-Z][A-Z_]{0,39}$`)

// netReason says in fixed words why a connection failed: a network
// error's text may carry a URL the registry chose (a redirect's).
func netReason(err error) string {
	var (
		de  *net.DNSError
		cve *tls.CertificateVerificationError
		rhe tls.RecordHeaderError
	)
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return "no route to the host"
	case errors.As(err, &de):
		if de.IsNotFound {
			return "no such host"
		}
		return "the name does not resolve"
	case errors.As(err, &cve):
		return "its TLS certificate does not verify"
	case errors.As(err, &rhe):
		return "it does not speak TLS (a plain HTTP registry must be listed with shard serve --insecure-registry)"
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return "the connection was cut off"
	}
	return "network error"
}

// invalidReason says in fixed words what was wrong with what a registry
// sent.
func invalidReason(err error) string {
	var (
		se *json.SyntaxError
		ue *json.UnmarshalTypeError
	)
	switch {
	case errors.As(err, &se), errors.As(err, &ue):
		return "a document it sent is not valid JSON of its kind"
	case strings.Contains(err.Error(), "digest"):
		return "what it sent does not match its digest"
	}
	return "what it sent does not parse"
}

func hasCode(te *transport.Error, codes ...transport.ErrorCode) bool {
	for _, d := range te.Errors {
		for _, c := range codes {
			if d.Code == c {
				return true
			}
		}
	}
	return false
}

func isNetworkError(err error) bool {
	var (
		ue  *url.Error
		oe  *net.OpError
		de  *net.DNSError
		ne  net.Error
		cve *tls.CertificateVerificationError
		rhe tls.RecordHeaderError
	)
	// A bare errno is a net.Error too (it has Timeout and Temporary): one
	// from unpacking on the local disk is not the registry's.
	if errors.As(err, &ne) {
		if _, errno := ne.(syscall.Errno); !errno {
			return true
		}
	}
	return errors.As(err, &ue) || errors.As(err, &oe) || errors.As(err, &de) ||
		errors.As(err, &cve) || errors.As(err, &rhe) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET)
}
