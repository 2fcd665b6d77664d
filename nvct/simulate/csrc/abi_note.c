/*
 * An NT_GNU_ABI_TAG note ("Linux 2.3.99"), as libnvidia-tls carries one:
 * libnvidia-container refuses that library without it.
 */
struct abi_note {
    unsigned int namesz, descsz, type;
    char name[4];
    unsigned int desc[4];
};

__attribute__((section(".note.ABI-tag"), aligned(4), used))
static const struct abi_note nvct_abi_tag = {4, 16, 1, "GNU", {0, 2, 3, 99}};
