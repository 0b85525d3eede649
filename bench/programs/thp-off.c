/* Runs a command with THP disabled for its whole tree (PR_SET_THP_DISABLE,
 * inherited and kept across exec), as `hugelab record` runs what it records:
 * the baseline of the recorder's overhead. */
#include <stdio.h>
#include <sys/prctl.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: thp-off CMD ARGS\n");
        return 2;
    }
    if (prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0) {
        perror("prctl(PR_SET_THP_DISABLE)");
        return 1;
    }
    execvp(argv[1], argv + 1);
    perror(argv[1]);
    return 127;
}
