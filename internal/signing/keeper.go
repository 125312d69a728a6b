package signing

import (
	"bytes"
	"context"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Keeper holds the current key and notices when it changes (a deleted and
// recreated Secret). The manager's Keeper creates the Secret; the image
// service's only reads it.
type Keeper struct {
	Reader    client.Reader
	Writer    client.Writer // nil: never create the Secret
	Namespace string
	Interval  time.Duration
	Log       logr.Logger

	mu      sync.RWMutex
	key     Key
	changes chan struct{}
	once    sync.Once
}

func (k *Keeper) init() { k.once.Do(func() { k.changes = make(chan struct{}, 1) }) }

// Key returns the current key, or ErrNoKey before the first load.
func (k *Keeper) Key() (Key, error) {
	k.mu.RLock()
	defer k.mu.RUnlock()
	if !k.key.Valid() {
		return Key{}, ErrNoKey
	}
	return k.key, nil
}

// Changes delivers a value whenever the key changes.
func (k *Keeper) Changes() <-chan struct{} {
	k.init()
	return k.changes
}

// Start loads the key and reloads it every Interval until ctx ends.
func (k *Keeper) Start(ctx context.Context) error {
	k.init()
	interval := k.Interval
	if interval == 0 {
		interval = 30 * time.Second
	}
	for {
		k.refresh(ctx)
		wait := interval
		if _, err := k.Key(); err != nil {
			wait = time.Second
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

func (k *Keeper) refresh(ctx context.Context) {
	key, err := Ensure(ctx, k.Reader, k.Writer, k.Namespace)
	if err != nil {
		k.Log.Error(err, "signing key unavailable; retrying")
		return
	}
	k.mu.Lock()
	changed := !bytes.Equal(k.key.k, key.k)
	k.key = key
	k.mu.Unlock()
	if changed {
		k.Log.Info("signing key loaded", "secret", k.Namespace+"/"+SecretName)
		select {
		case k.changes <- struct{}{}:
		default:
		}
	}
}

// NeedLeaderElection is false: every replica signs and verifies.
func (k *Keeper) NeedLeaderElection() bool { return false }
