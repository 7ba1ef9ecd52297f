package cluster

import (
	"context"
	"errors"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// etcd answers a request that met a leader election with an error that
// says to try again (the client retries reads on its own, not writes): a
// member lost must not fail a create. retryKV tries a write again, a few
// times within its context, when etcd says so. Every write of this
// package is a compare-and-swap or a put or delete of one key, so one
// applied before the error is found so by the next try.
type retryKV struct{ clientv3.KV }

// transient reports an etcd error that a retry may cure.
func transient(err error) bool {
	return errors.Is(err, rpctypes.ErrLeaderChanged) || errors.Is(err, rpctypes.ErrNoLeader) ||
		errors.Is(err, rpctypes.ErrTimeoutDueToLeaderFail) || errors.Is(err, rpctypes.ErrTimeoutDueToConnectionLost)
}

// retry runs f until it succeeds, fails for good, or ctx ends (at most 6
// tries, 50 ms apart and growing).
func retry(ctx context.Context, f func() error) error {
	var err error
	for i := range 6 {
		if err = f(); err == nil || !transient(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Duration(i+1) * 50 * time.Millisecond):
		}
	}
	return err
}

func (k retryKV) Put(ctx context.Context, key, val string, opts ...clientv3.OpOption) (resp *clientv3.PutResponse, err error) {
	err = retry(ctx, func() error { resp, err = k.KV.Put(ctx, key, val, opts...); return err })
	return resp, err
}

func (k retryKV) Delete(ctx context.Context, key string, opts ...clientv3.OpOption) (resp *clientv3.DeleteResponse, err error) {
	err = retry(ctx, func() error { resp, err = k.KV.Delete(ctx, key, opts...); return err })
	return resp, err
}

func (k retryKV) Txn(ctx context.Context) clientv3.Txn { return &retryTxn{kv: k.KV, ctx: ctx} }

// retryTxn keeps a transaction's parts, to send it again.
type retryTxn struct {
	kv              clientv3.KV
	ctx             context.Context
	cmps            []clientv3.Cmp
	thenOps, elseOp []clientv3.Op
}

func (t *retryTxn) If(cs ...clientv3.Cmp) clientv3.Txn { t.cmps = append(t.cmps, cs...); return t }
func (t *retryTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.thenOps = append(t.thenOps, ops...)
	return t
}
func (t *retryTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.elseOp = append(t.elseOp, ops...)
	return t
}

func (t *retryTxn) Commit() (resp *clientv3.TxnResponse, err error) {
	err = retry(t.ctx, func() error {
		resp, err = t.kv.Txn(t.ctx).If(t.cmps...).Then(t.thenOps...).Else(t.elseOp...).Commit()
		return err
	})
	return resp, err
}
