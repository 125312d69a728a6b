package container

import (
	"context"
	"os"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// WriteSecretVolume writes a Secret's data into dir as the kubelet's atomic
// writer does: a directory of the data, swapped in whole through the
// ..data symlink, each key a symlink into it. Files have mode (a volume's
// defaultMode) and, when gid is not -1, that group (the pod's fsGroup).
func WriteSecretVolume(dir string, data map[string][]byte, mode os.FileMode, gid int) error {
	ts, err := os.MkdirTemp(dir, "..ts-")
	if err != nil {
		return err
	}
	if err := os.Chmod(ts, 0o755); err != nil {
		return err
	}
	for k, v := range data {
		p := filepath.Join(ts, k)
		if err := os.WriteFile(p, v, mode); err != nil {
			return err
		}
		if err := os.Chmod(p, mode); err != nil { // past the umask
			return err
		}
		if gid != -1 {
			if err := os.Chown(p, 0, gid); err != nil {
				return err
			}
		}
	}
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	tmp := filepath.Join(dir, "..data_tmp")
	_ = os.Remove(tmp)
	if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		return err
	}
	for k := range data {
		link := filepath.Join(dir, k)
		if _, err := os.Lstat(link); err == nil {
			continue
		}
		if err := os.Symlink(filepath.Join("..data", k), link); err != nil {
			return err
		}
	}
	if old != "" {
		return os.RemoveAll(filepath.Join(dir, old))
	}
	return nil
}

// MountSecret plays the kubelet for a Secret volume: it writes the
// Secret's keys into dir (WriteSecretVolume) once it exists, and again
// whenever it changes, until ctx ends. The kubelet syncs about once a
// minute; this does every 200ms.
func MountSecret(ctx context.Context, c client.Reader, key client.ObjectKey, dir string, mode os.FileMode, gid int, log logr.Logger) {
	last := ""
	for ctx.Err() == nil {
		var s corev1.Secret
		err := c.Get(ctx, key, &s)
		if err == nil && s.ResourceVersion != last {
			if err = WriteSecretVolume(dir, s.Data, mode, gid); err == nil {
				last = s.ResourceVersion
			}
		}
		if err != nil && !apierrors.IsNotFound(err) && ctx.Err() == nil {
			log.Error(err, "mount Secret", "secret", key.String(), "dir", dir)
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}
