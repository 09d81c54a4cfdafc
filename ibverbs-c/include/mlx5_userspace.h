/*
 * Embedding the mlx5-userspace libibverbs.so.1 in a program (SPDK, DPDK
 * or any data plane that links libibverbs).
 *
 * The library is a drop-in libibverbs.so.1: build against rdma-core's
 * <infiniband/verbs.h> and link -libverbs as usual; at run time point the
 * loader at this library (LD_LIBRARY_PATH, or an rpath). The functions it
 * drives are named by the environment variable MLX5_DEVICES, or, for a
 * program that configures itself, by mlx5u_set_devices() below, called
 * before the first ibv_get_device_list().
 *
 * A device list is comma separated; each entry is one of
 *   emu[:PROFILE]    a device-model function inside this process
 *                    (PROFILE cx4lx, cx5, cx6, cx7); all of them are
 *                    cabled together, a single one is looped back
 *   vfio-user:PATH   a function served over vfio-user (mlx5-emu serve)
 *   DDDD:BB:DD.F     a PCI function bound to vfio-pci
 * and the devices are named mlx5_0, mlx5_1, ... in that order.
 *
 * Memory given to ibv_reg_mr may be any readable and writable memory of
 * the process. Over vfio-user, private memory (the heap, the stack,
 * MAP_PRIVATE|MAP_ANONYMOUS) is remapped in place to a shared memfd at
 * registration so the server can reach it; allocate from a memfd or
 * hugetlbfs to avoid that copy.
 */
#ifndef MLX5_USERSPACE_H
#define MLX5_USERSPACE_H

#include <infiniband/verbs.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Sets the device list (the syntax of MLX5_DEVICES), overriding the
 * environment. Returns 0, EINVAL for a NULL list, or EBUSY once the list
 * has been read (the first ibv_get_device_list() reads it).
 */
int mlx5u_set_devices(const char *list);

#ifdef __cplusplus
}
#endif

#endif /* MLX5_USERSPACE_H */
