/* The floor of bench/cgi-bench.sh: the C hello-world CGI an Apache user
 * would write first, a header and a line with printf, compiled by the
 * bench with `cc -O2` (dynamic) and `cc -O2 -static`. It reads its body
 * first (CONTENT_LENGTH bytes), as any CGI answering a POST must: under
 * mod_cgid a CGI's input and output are one socket, and exiting with
 * request bytes unread resets it, losing the answer (ab counts those as
 * failed requests). Nothing a CGI can do costs less, so pubsub.cgi's
 * notify is measured against it. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(void)
{
    const char *length = getenv("CONTENT_LENGTH");
    long left = length ? atol(length) : 0;
    char buf[4096];
    while (left > 0) {
        ssize_t n = read(0, buf, left < (long)sizeof buf ? (size_t)left : sizeof buf);
        if (n <= 0)
            break;
        left -= n;
    }
    printf("Content-Type: text/plain\r\n\r\n");
    printf("hello\n");
    return 0;
}
