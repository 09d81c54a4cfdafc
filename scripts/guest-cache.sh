# Sourced by the guest scripts: where guest kernels and downloads are cached,
# outside the repository. MLX5_GUEST_CACHE overrides; root uses /var/cache,
# anyone else $XDG_CACHE_HOME (or ~/.cache).
if [ -n "${MLX5_GUEST_CACHE:-}" ]; then
    GUEST_CACHE="$MLX5_GUEST_CACHE"
elif [ "$(id -u)" = 0 ]; then
    GUEST_CACHE=/var/cache/mlx5-userspace
else
    GUEST_CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/mlx5-userspace"
fi
mkdir -p "$GUEST_CACHE"
export GUEST_CACHE
