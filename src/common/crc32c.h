/* Internal: CRC32C checksums. */
#ifndef DISTRO_COMMON_CRC32C_H
#define DISTRO_COMMON_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* crc32c("123456789") == 0xe3069283. update() continues a previous value. */
uint32_t distro__crc32c(const void *data, size_t n);
uint32_t distro__crc32c_update(uint32_t crc, const void *data, size_t n);

#endif
