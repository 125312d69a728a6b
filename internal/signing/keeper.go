package signing

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Keeper holds the current key and notices when it changes (a deleted and
// recreated Secret). The manager's Keeper creates the master key's Secret
// and keeps the image service's and the agent API's Secrets in step with
// it; an image service running apart reads only its own (ImageService), and
// an agent API running apart only the files its Secret is mounted as (Dir).
type Keeper struct {
	Reader client.Reader
	// Writer creates the Secrets; nil: never.
	Writer client.Writer
	// ImageService reads the image service's keys instead of the master key.
	ImageService bool
	// Dir, when set, is where the kubelet mounts the agent API's keys
	// (AgentAPISecretName, one file per purpose): they are read from
	// there, not from the apiserver.
	Dir       string
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

// attemptTimeout bounds one load: a request that hangs (an apiserver that
// accepted the connection and never answers) is given up and tried again,
// instead of leaving the process without a key.
const attemptTimeout = 30 * time.Second

func (k *Keeper) refresh(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, attemptTimeout)
	defer cancel()
	key, name, err := k.load(ctx)
	if err != nil {
		k.Log.Error(err, "signing key unavailable; retrying")
		return
	}
	k.mu.Lock()
	changed := k.key.Fingerprint() != key.Fingerprint()
	k.key = key
	k.mu.Unlock()
	if changed {
		k.Log.Info("signing key loaded", "from", name, "fingerprint", key.Fingerprint())
		select {
		case k.changes <- struct{}{}:
		default:
		}
	}
}

func (k *Keeper) load(ctx context.Context) (Key, string, error) {
	if k.Dir != "" {
		data, err := readMounted(k.Dir, AgentAPIPurposes)
		if err != nil {
			return Key{}, k.Dir, fmt.Errorf("read the agent API's keys (Secret %s, mounted at %s; the manager writes it): %w", AgentAPISecretName, k.Dir, err)
		}
		key, err := FromDerived(data, AgentAPIPurposes, "the agent API's keys in "+k.Dir)
		return key, k.Dir, err
	}
	if k.ImageService {
		var s corev1.Secret
		if err := k.Reader.Get(ctx, client.ObjectKey{Namespace: k.Namespace, Name: ImageServiceSecretName}, &s); err != nil {
			return Key{}, ImageServiceSecretName, fmt.Errorf("read the image service's keys %s/%s (the manager writes them): %w", k.Namespace, ImageServiceSecretName, err)
		}
		key, err := FromDerived(s.Data, ImageServicePurposes, "Secret "+k.Namespace+"/"+s.Name)
		return key, "Secret " + k.Namespace + "/" + ImageServiceSecretName, err
	}
	key, err := Ensure(ctx, k.Reader, k.Writer, k.Namespace)
	if err != nil || k.Writer == nil {
		return key, "Secret " + k.Namespace + "/" + SecretName, err
	}
	for _, d := range []struct {
		name     string
		purposes []string
	}{{ImageServiceSecretName, ImageServicePurposes}, {AgentAPISecretName, AgentAPIPurposes}} {
		if err := k.syncDerived(ctx, DerivedSecret(key, k.Namespace, d.name, d.purposes)); err != nil {
			return key, SecretName, err
		}
	}
	return key, "Secret " + k.Namespace + "/" + SecretName, nil
}

// syncDerived writes a Secret of keys derived from the master key.
func (k *Keeper) syncDerived(ctx context.Context, want *corev1.Secret) error {
	var have corev1.Secret
	err := k.Reader.Get(ctx, client.ObjectKeyFromObject(want), &have)
	switch {
	case apierrors.IsNotFound(err):
		err = k.Writer.Create(ctx, want)
		if apierrors.IsAlreadyExists(err) {
			return nil // another replica; checked again next time
		}
	case err == nil && !equality.Semantic.DeepEqual(have.Data, want.Data):
		have.Data = want.Data
		err = k.Writer.Update(ctx, &have)
	}
	if err != nil {
		return fmt.Errorf("write the derived keys %s/%s: %w", k.Namespace, want.Name, err)
	}
	return nil
}

// NeedLeaderElection is false: every replica signs and verifies.
func (k *Keeper) NeedLeaderElection() bool { return false }

// readMounted reads the files of a mounted Secret volume. The kubelet
// writes each version into a directory of its own and swaps the ..data
// symlink to it; the files are read from the directory ..data names, the
// same one for all of them, and again if it was swapped meanwhile. A
// directory without ..data (not the kubelet's) is read as it is.
func readMounted(dir string, names []string) (map[string][]byte, error) {
	for range 5 {
		before, _ := os.Readlink(filepath.Join(dir, "..data"))
		from := dir
		switch {
		case filepath.IsAbs(before):
			from = before
		case before != "":
			from = filepath.Join(dir, before)
		}
		data := map[string][]byte{}
		var err error
		for _, n := range names {
			if data[n], err = os.ReadFile(filepath.Join(from, n)); err != nil {
				break
			}
		}
		after, _ := os.Readlink(filepath.Join(dir, "..data"))
		if after == before {
			return data, err
		}
	}
	return nil, fmt.Errorf("%s changed while it was read, five times", dir)
}
